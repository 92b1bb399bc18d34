"""LLaVA both ways: a transformers LLaVA imports as a MimoModel with the same logits, and a MimoModel
trained a few steps exports to a directory LlavaForConditionalGeneration loads with the same logits and
the same greedy tokens. `mimo export` writes the same from a run folder."""

import pytest
import torch

from mimo.cli import main
from mimo.config.load import dump_toml
from mimo.config.schema import Config, ModalityConfig, ModelConfig, ViTConfig
from mimo.export import export_llava
from mimo.hf import import_llava
from mimo.hf.build import build_model
from mimo.models.generate import greedy_generate
from mimo.models.multimodal import MimoModel
from mimo.train.checkpoint.weights import save_weights
from tests.support.configs import tiny_llm
from tests.support.hf_helpers import (
    TOL,
    llava_logits,
    perturb,
    rel_diff,
    save,
    tiny_llava,
    transformers,
)

pytestmark = pytest.mark.usefixtures("one_thread")

IMG = 60
SIGLIP_VIT = dict(class_token=False, pre_norm=False, patch_bias=True, act="gelu_tanh")


# "default" drops the tower's first output token: CLIP's class token, SigLIP's first patch (16 patches).
@pytest.mark.parametrize("tower,strategy,rows", [("clip", "default", 16), ("clip", "full", 17),
                                                 ("siglip", "full", 16), ("siglip", "default", 15)])
def test_import_llava_matches_transformers(tower, strategy, rows, tmp_path):
    torch.manual_seed(0)
    hf = perturb(tiny_llava(tower, strategy=strategy))
    cfg, model = import_llava(save(hf, tmp_path / tower))
    assert cfg.modalities["images"].vit.layers == 2
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    assert n == rows
    ours, ref, ids, pixels = llava_logits(hf, model)
    inputs = {"images": {"vit": {"pixel_values": pixels}}}
    with torch.no_grad():
        # The live model keeps the 5.x layout (model.language_model.*), the directory the saved one.
        from_object = import_llava(hf)[1](ids, modality_inputs=inputs).logits
    assert rel_diff(ours, ref) <= TOL and rel_diff(from_object, ref) <= TOL


def trained_model(vit: ViTConfig, vocab: int = 64, token: int = IMG) -> tuple[ModelConfig, MimoModel]:
    """A tiny VLM after three AdamW steps on a fixed batch (so no weight is at its initial value)."""
    cfg = ModelConfig(llm=tiny_llm(init_std=0.2, vocab=vocab),
                      modalities={"images": ModalityConfig(token_id=token, vit=vit)})
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, inputs = prompt(model)
    for _ in range(3):
        model(ids, labels=ids.roll(-1, 1), modality_inputs=inputs).loss_sum.backward()
        opt.step()
        opt.zero_grad()
    return cfg, model.eval()


def prompt(model: MimoModel) -> tuple[torch.Tensor, dict]:
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    img = model.special_token_ids["images"]
    ids = torch.tensor([[1] + [img] * n + [5, 6, 7, 8], [2] + [img] * n + [9, 10, 11, 12]])
    torch.manual_seed(4)
    return ids, {"images": {"vit": {"pixel_values": torch.randn(2, 3, 16, 16)}}}


def check_llava_directory(model: MimoModel, directory) -> None:
    hf, info = transformers.LlavaForConditionalGeneration.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    hf = hf.float().eval()
    ids, inputs = prompt(model)
    pixels = inputs["images"]["vit"]["pixel_values"]
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=pixels).logits
        ours = model(ids, modality_inputs=inputs).logits
    assert rel_diff(ours, ref) <= TOL
    eos = 63
    tokens = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels, max_new_tokens=8,
                         do_sample=False, eos_token_id=eos, pad_token_id=eos)[:, ids.shape[1]:].tolist()
    ours_tokens = greedy_generate(model, ids, inputs, max_new_tokens=8, eos_id=eos)
    assert [row[: len(o)] for row, o in zip(tokens, ours_tokens)] == ours_tokens


@pytest.mark.parametrize("tower", ["clip", "siglip", "siglip_default"])
def test_export_trained_model_to_llava(tower, tmp_path):
    siglip = dict(SIGLIP_VIT, drop_first_patch=tower == "siglip_default")
    vit = ViTConfig(image=16, patch=8, hidden=16, heads=2, mlp=32, **(siglip if tower != "clip" else {}))
    _, model = trained_model(vit)
    check_llava_directory(model, export_llava(model, tmp_path / "llava"))


def test_cli_export_run(tmp_path):
    # A byte-tokenizer run: its export names the byte tokenizer's placeholder (259) <image>.
    cfg, model = trained_model(ViTConfig(image=16, patch=8, hidden=16, heads=2, mlp=32, drop_class_token=False),
                               vocab=262, token=259)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(Config(model=cfg)))
    save_weights(model, run)
    with pytest.raises(SystemExit) as done:
        main(["export", "--run", str(run), "--to", str(tmp_path / "llava")])
    assert done.value.code == 0
    check_llava_directory(model, tmp_path / "llava")
    with pytest.raises(SystemExit) as done:
        main(["export", "--run", str(run), "--to", str(tmp_path / "lm"), "--lm-only"])
    assert done.value.code == 0
    lm = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lm").float().eval()
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        ref = lm(input_ids=ids).logits
        ours = model(ids).logits
    assert type(lm).__name__ == "Qwen2ForCausalLM" and rel_diff(ours, ref) <= TOL
    with pytest.raises(SystemExit) as done:
        main(["export", "--run", str(run), "--to", str(tmp_path / "lm")])
    assert done.value.code == 2


def test_post_norm_tower_is_refused_for_llava(tmp_path):
    _, model = trained_model(ViTConfig(image=16, patch=8, hidden=16, heads=2, mlp=32, post_norm=True,
                                       **SIGLIP_VIT))
    with pytest.raises(ValueError, match="post_norm"):
        export_llava(model, tmp_path / "x")
