"""Qwen2, Qwen3 and Llama: imported weights give transformers' hidden states and logits (padding mask and
position ids included), and an exported mimo LM loads as the matching ForCausalLM with the same logits."""

import pytest
import torch

from mimo.export import export_causal_lm
from mimo.hf import import_llm, import_vision
from mimo.models.llm import DecoderLM
from tests.support.configs import tiny_llm
from tests.support.hf_helpers import (
    TOL,
    compare,
    perturb,
    save,
    tiny_causal_lm,
    tiny_vision_config,
    transformers,
)

pytestmark = pytest.mark.usefixtures("one_thread")

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
CASES = {"qwen2": ("qwen2", {}), "qwen2_tied": ("qwen2", {"tie_word_embeddings": True}), "qwen3": ("qwen3", {}),
         "llama": ("llama", {}), "llama3_rope": ("llama", {"rope_parameters": LLAMA3_ROPE})}


@pytest.mark.parametrize("case", list(CASES))
def test_import_matches_transformers(case, tmp_path):
    family, extra = CASES[case]
    hf = perturb(tiny_causal_lm(family, **extra))
    lm = import_llm(save(hf, tmp_path / case))
    assert lm.cfg.qk_norm == (family == "qwen3") and lm.cfg.qkv_bias == (family == "qwen2")
    assert (lm.lm_head is None) == bool(extra.get("tie_word_embeddings"))
    hidden, logits = compare(lm, hf)
    assert hidden <= TOL and logits <= TOL, (case, hidden, logits)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    assert a.state_dict().keys() == b.state_dict().keys()
    for name, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[name]), name


@pytest.mark.parametrize("family", ["qwen3", "mixtral"])
def test_import_from_model_object_equals_directory(family, tmp_path):
    """Mixtral's live experts are stacked (transformers renames them on load), its files hold one per expert."""
    hf = perturb(tiny_causal_lm(family))
    _same_weights(import_llm(save(hf, tmp_path / family)), import_llm(hf))


def test_a_live_tower_whose_names_transformers_converts_imports_as_its_directory(tmp_path):
    """A live DINOv2 names its attention q_proj/k_proj/v_proj/o_proj; its files attention.attention.query ..."""
    hf = perturb(transformers.Dinov2Model(tiny_vision_config("dinov2")).eval())
    _same_weights(import_vision(save(hf, tmp_path / "dinov2")), import_vision(hf))


EXPORT_CASES = {
    "Qwen2ForCausalLM": tiny_llm(vocab=61, mlp=48, init_std=0.2),
    "Qwen3ForCausalLM": tiny_llm(vocab=61, kv_heads=1, mlp=48, qkv_bias=False, qk_norm=True, head_dim=16,
                                 tie_embeddings=True, init_std=0.2),
    "LlamaForCausalLM": tiny_llm(vocab=61, mlp=48, qkv_bias=False, rope_theta=5e5, init_std=0.2, rope_scaling={
                                      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 16.0}),
}


@pytest.mark.parametrize("arch", list(EXPORT_CASES))
def test_export_loads_as_causal_lm(arch, tmp_path):
    torch.manual_seed(3)
    lm = perturb(DecoderLM(EXPORT_CASES[arch])).eval()
    out = export_causal_lm(lm, tmp_path / "out")
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(hf).__name__ == arch
    assert not info["missing_keys"] and not info["unexpected_keys"]
    hidden, logits = compare(lm, hf.float().eval())
    assert hidden <= TOL and logits <= TOL, (arch, hidden, logits)


def test_large_export_is_sharded_and_reimports(tmp_path):
    torch.manual_seed(3)
    lm = perturb(DecoderLM(EXPORT_CASES["Qwen2ForCausalLM"])).eval()
    out = export_causal_lm(lm, tmp_path / "out", max_shard_bytes=8 * 1024)
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 2 and (out / "model.safetensors.index.json").is_file()
    again = import_llm(out)
    for (name, a), (_, b) in zip(lm.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    assert max(compare(lm, hf)) <= TOL
