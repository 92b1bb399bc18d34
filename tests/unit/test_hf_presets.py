"""The LLaVA presets assemble a MimoModel from Hugging Face directories: architecture from config.json,
weights loaded, LM and tower frozen, and the resolved config saves and reloads."""

from pathlib import Path

import pytest
import torch

from mimo.config.load import dump_toml, load_config
from mimo.config.schema import ConfigError
from mimo.export import export_llava
from mimo.hf.build import build_model
from tests.support.hf_helpers import TOL, llava_parts, rel_diff, transformers

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def build_preset(tmp_path, preset: str, lm_family: str, tower: str, extra: list[str] = ()):
    lm, vision, overrides = llava_parts(tmp_path, lm_family, tower)
    cfg = load_config(CONFIGS / preset, [*overrides, *extra])
    return cfg, build_model(cfg.model), lm, vision


def check_parts(model, lm, vision, feature_layer: int, drop_cls: bool) -> None:
    ids = torch.randint(0, 90, (2, 9))
    pixels = torch.randn(2, 3, 18, 18)
    with torch.no_grad():
        assert rel_diff(model(ids).logits, lm(input_ids=ids).logits) <= TOL
        ref = vision(pixel_values=pixels, output_hidden_states=True).hidden_states[feature_layer]
        ours = model.modality_submodules["images"].encoders["vit"](pixels)
    assert rel_diff(ours, ref[:, 1:] if drop_cls else ref) <= TOL


def test_qwen2_siglip_preset(tmp_path):
    cfg, model, lm, vision = build_preset(tmp_path, "llava_qwen2_siglip.toml", "qwen2", "siglip")
    llm, vit = cfg.model.llm, cfg.model.modalities["images"].vit
    assert (llm.vocab, llm.hidden, llm.qkv_bias, vit.image, vit.patch, vit.class_token) == (97, 32, True, 18, 4, False)
    check_parts(model, lm, vision, -1, drop_cls=False)
    assert not any(p.requires_grad for p in model.language_model.parameters())
    sub = model.modality_submodules["images"]
    assert not any(p.requires_grad for p in sub.encoders.parameters())
    assert all(p.requires_grad for p in sub.input_projections.parameters())
    saved = tmp_path / "config.toml"
    saved.write_text(dump_toml(cfg))
    assert load_config(saved).model == cfg.model


def test_llama_clip_preset_uses_the_penultimate_layer(tmp_path):
    cfg, model, lm, vision = build_preset(tmp_path, "llava_llama_clip.toml", "llama", "clip")
    assert cfg.model.modalities["images"].vit.layers == 2 and not cfg.model.llm.qkv_bias
    check_parts(model, lm, vision, -2, drop_cls=True)
    out = export_llava(model, tmp_path / "llava")
    llava = transformers.LlavaForConditionalGeneration.from_pretrained(out).float().eval()
    ids = torch.tensor([[1] + [90] * 16 + [5, 6]])
    pixels = torch.randn(1, 3, 18, 18)
    with torch.no_grad():
        ref = llava(input_ids=ids, pixel_values=pixels).logits
        ours = model(ids, modality_inputs={"images": {"vit": {"pixel_values": pixels}}}).logits
    assert rel_diff(ours, ref) <= TOL


def test_placeholder_outside_the_checkpoint_vocabulary_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"token_id \(500\) must lie in \[0, 97\)"):
        build_preset(tmp_path, "llava_qwen2_siglip.toml", "qwen2", "siglip",
                     ["--model.modalities.images.token_id=500"])


def test_missing_hf_path_names_the_field(tmp_path):
    cfg = load_config(CONFIGS / "llava_qwen2_siglip.toml", [f"--model.llm.hf_path={tmp_path / 'absent'}"])
    with pytest.raises(FileNotFoundError, match="model.llm.hf_path"):
        build_model(cfg.model)
