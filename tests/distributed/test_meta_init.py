"""Built on the meta device, every rank materialises only what it holds, with the single-process values: on
every layout of the fast-path parity suite (tp2 + SP, cp2 x tp2, FSDP2, the colocated fan-in, the 3-rank
pipeline) plus LM tp4 and FSDP over 4, a `Trainer`'s initial weights, gathered whole, equal the
single-process `Trainer`'s bit for bit, and no rank holds more than its share of a sharded module."""

from __future__ import annotations

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.fast_path_runs import LANG, LAYOUTS, MODEL
from tests.support.tiny_run import tiny_config

EXTRA = {
    "tp4": (4, ["--model.llm.kv_heads=4", f"{LANG}.tp=4"]),
    "fsdp4": (4, [f"{LANG}.fsdp=true", "--parallel.modules.images.fsdp=true"]),
}


def _initial(rank: int, world: int, out: str, overrides: list[str]) -> dict:
    trainer = Trainer(tiny_config(out, *MODEL, *overrides))
    local = {n: p.to_local() if hasattr(p, "to_local") else p for n, p in trainer.model.named_parameters()}
    assert not any(p.is_meta for p in local.values())
    held = sum(p.numel() for p in local.values())
    full = trainer.plan.gather_full(trainer.model)
    return {"held": held, "params": {n: t.numpy() for n, t in full.items()}}


@pytest.mark.parametrize("name", [*LAYOUTS, *EXTRA])
def test_initial_weights_equal_single_process_bit_for_bit(tmp_path, name):
    world, layout = {**LAYOUTS, **EXTRA}[name]
    extra = EXTRA[name][1][:1] if name == "tp4" else []
    ref_trainer = Trainer(tiny_config(tmp_path / "ref", *MODEL, *extra))
    ref = {n: p.detach() for n, p in ref_trainer.model.named_parameters()}
    total = sum(p.numel() for p in ref.values())
    results = run_distributed(_initial, world, str(tmp_path / name), layout, timeout=240)
    got = results[0]["params"]
    assert sorted(got) == sorted(ref)
    for n, t in ref.items():
        assert torch.equal(torch.from_numpy(got[n]), t), f"{name}: initial {n} differs from one process"
    if name in ("tp4", "fsdp4", "fsdp2"):  # sharded LM: each rank holds well under the whole model
        assert max(r["held"] for r in results) < 0.75 * total
