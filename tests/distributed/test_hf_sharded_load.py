"""`hf_path` weights load on any layout with each rank reading only its pieces from the safetensors files: a
`Trainer` on LM tp2 + encoder tp2, on FSDP2 of both modules and on the 3-rank pipeline holds, gathered
whole, exactly the single-process model (which holds the Hugging Face tensors themselves), and on the sharded
layouts every rank reads well under the checkpoints' elements (the reads are recorded at the file level)."""

from __future__ import annotations

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.hf_helpers import perturb, record_reads, save, tiny_causal_lm, tiny_vision_config, transformers
from tests.support.tiny_run import tiny_config

LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
LAYOUTS = {
    "tp2": (2, [f"{LANG}.tp=2", f"{IMG}.tp=2"]),
    "fsdp2": (2, [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"]),
    "pipeline3": (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2",
                      "--parallel.microbatches=2"]),
}


def _config(out, lm_dir, tower_dir, *overrides):
    # heads as the checkpoint has them: the layout is checked before config.json resolves the architecture
    return tiny_config(out, "--model.llm.heads=4", "--model.llm.kv_heads=2", "--model.llm.mlp=48",
                       "--model.llm.layers=2",
                       f"--model.llm.hf_path={lm_dir}", f"--model.modalities.images.hf_path={tower_dir}",
                       *overrides)


def _load(rank: int, world: int, out: str, lm_dir: str, tower_dir: str, layout: list[str]) -> dict:
    reads: list[int] = []
    record_reads(reads)
    trainer = Trainer(_config(out, lm_dir, tower_dir, *layout))
    full = trainer.plan.gather_full(trainer.model)
    return {"read": sum(reads), "params": {n: t.numpy() for n, t in full.items()}}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    lm = perturb(tiny_causal_lm("qwen2", vocab_size=272, num_attention_heads=4, num_key_value_heads=2))
    torch.manual_seed(0)
    tower = perturb(transformers.CLIPVisionModel(tiny_vision_config("clip", image_size=32, patch_size=16)).eval())
    elements = sum(t.numel() for m in (lm, tower) for t in m.state_dict().values())
    return save(lm, root / "lm"), save(tower, root / "tower"), lm, elements


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_hf_weights_load_on_every_layout_reading_only_slices(tmp_path, hf_dirs, name):
    lm_dir, tower_dir, hf_lm, whole = hf_dirs
    world, layout = LAYOUTS[name]
    ref = Trainer(_config(tmp_path / "ref", lm_dir, tower_dir)).model
    ref_params = {n: p.detach() for n, p in ref.named_parameters()}
    assert torch.equal(ref_params["language_model.embed_tokens.weight"], hf_lm.model.embed_tokens.weight)
    results = run_distributed(_load, world, str(tmp_path / name), str(lm_dir), str(tower_dir), layout, timeout=240)
    got = results[0]["params"]
    assert sorted(got) == sorted(ref_params)
    for n, t in ref_params.items():
        assert torch.equal(torch.from_numpy(got[n]), t), f"{name}: {n} differs from the single-process load"
    for r in results:
        assert 0 < r["read"] < (0.75 if name != "pipeline3" else 1.0) * whole, (name, r["read"], whole)
