"""Mixture-of-experts LMs both ways against transformers in fp32 (<= 1e-5 relative, random configs, a left-padded
batch): Qwen3-MoE (with a dense layer), Qwen2-MoE (gated shared expert) and Mixtral, alone and as the LM of a
LLaVA model; the export loads as the same class with the same logits."""

import copy

import pytest
import torch

from mimo.export.config import text_architecture
from mimo.hf import import_llm
from mimo.hf.build import build_model
from mimo.hf.files import DirectorySource
from mimo.hf.load import dim_shard_fn, hf_slice
from mimo.hf.names import ExpertStack, llm_names
from mimo.train.trainer import Trainer
from tests.support.configs import tiny_llm
from tests.support.hf_helpers import (
    TOL,
    compare,
    llava_both_ways,
    lm_both_ways,
    perturb,
    save,
    tiny_causal_lm,
    transformers,
)
from tests.support.tiny_run import metrics, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "mixtral": "MixtralForCausalLM"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_lm_both_ways(family, tmp_path):
    lm = lm_both_ways(perturb(tiny_causal_lm(family)), tmp_path, FAMILIES[family])
    assert lm.cfg.moe_experts == 8 and lm.cfg.family == family
    assert [lm.cfg.is_moe_layer(i) for i in range(lm.cfg.layers)] == ([True, False, True] if family == "qwen3_moe"
                                                                        else [True, True])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_llava_with_moe_lm_both_ways(family, tmp_path):
    llava_both_ways(family, tmp_path)


def test_an_expert_shard_reads_only_its_experts(tmp_path):
    """Expert parallelism's view: rank 1 of 4 reads experts 2 and 3 of the stacked w_up, nothing else."""
    directory = save(perturb(tiny_causal_lm("mixtral")), tmp_path / "hf")
    lm = import_llm(directory)
    stack = llm_names(lm)["layers.0.mlp.w_up"]
    assert isinstance(stack, ExpertStack) and stack.names[2] == "model.layers.0.block_sparse_moe.experts.2.w3.weight"
    with DirectorySource(directory) as src:
        sl, _, _ = hf_slice(src, stack)
        piece = dim_shard_fn(lambda _: 0, 1, 4)("layers.0.mlp.w_up", sl)
    assert torch.equal(piece, lm.layers["0"].mlp.w_up.detach()[2:4])


@pytest.mark.parametrize("changes, fields", [
    ({"moe_gating": "sigmoid"}, "moe_gating = 'sigmoid'"),
    ({"qk_norm": True, "qkv_bias": False, "moe_shared_mlp": 8}, "no Hugging Face class"),
    ({"qkv_bias": False, "moe_norm_topk": False}, "no Hugging Face class"),
])
def test_moe_lms_no_family_computes_are_refused_naming_the_fields(changes, fields):
    with pytest.raises(ValueError, match=fields):
        text_architecture(tiny_llm(moe_experts=4, moe_mlp=8, **changes))


def test_an_hf_path_moe_lm_builds_with_its_weights_and_trains(tmp_path):
    """model.llm.hf_path on a Qwen2-MoE directory: the built VLM's LM is transformers' (logits within 1e-5) and
    `mimo train` trains it, logging each layer's expert loads."""
    directory = save(perturb(tiny_causal_lm("qwen2_moe", vocab_size=272)), tmp_path / "hf")
    cfg = tiny_config(tmp_path, f"--model.llm.hf_path={directory}", "--train.steps=2",
                      "--model.llm.moe_aux_loss_weight=0.01")
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory).float().eval()
    assert max(compare(build_model(copy.deepcopy(cfg.model)).language_model.eval(), hf)) <= TOL
    Trainer(cfg).train()
    rows = [r for r in metrics(tmp_path) if "moe_load" in r]
    assert len(rows) == 2 and set(rows[0]["moe_load"]) == {"0", "1"} and rows[0]["moe_aux_loss"] > 0
