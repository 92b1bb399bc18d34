"""Packed native-resolution data on several ranks trains exactly the unpacked samples in one process.

One global batch holds images of four sizes, a sample of two images of different sizes, a 3-frame video, a
text-only sample and a skipped one (tests.support.native_data); packed by first fit into rows of 160 tokens, seven
samples share a row, each keeping its own M-RoPE positions (three axes, restarting at 0) and its items. Two Trainer
steps on two data lanes, under the LM's cp2 (each rank's zigzag of the rows, the document mask of its positions) and
tp2 with sequence parallel, and on the tower on rank 0 feeding an LM pipeline of two stages (the document ids and the
`[B, S, 3]` positions travel with the activations) give the single process's unpacked losses and gradients within
1e-5 relative (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.config.load import load_config
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.dist import run_distributed
from tests.support.native_data import TINY, manifest
from tests.support.parity import assert_trains_like, trainer_steps

STEPS = 2
PACKED = ["--data.packing=true", "--data.pack_length=160"]
LAYOUTS = {  # name -> (world, overrides)
    "dp2": (2, []),
    "lm_cp2": (2, ["--parallel.modules.language.cp=2"]),
    "lm_tp2_sp": (2, ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true"]),
    "tower_then_lm_pp2": (3, ["--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
                              "--parallel.modules.language.offset=1", "--parallel.modules.language.size=2",
                              "--parallel.modules.language.pp=2", "--parallel.microbatches=2"]),
}


def _config(out: Path, data: str, *extra: str):
    overrides = [*TINY, f"--data.path={data}", f"--run.out_dir={out}", "--data.global_batch=8", "--optim.eps=1e-2",
                 "--optim.warmup_steps=0", "--model.llm.kv_heads=2", "--model.llm.layers=2", *extra]
    return load_config(CONFIGS / "native_qwen2_5_vl.toml", overrides)


def _rank(rank: int, world: int, out: str, data: str, extra: list[str]) -> tuple:
    trainer = Trainer(_config(Path(out), data, *PACKED, *extra))
    losses, grads = trainer_steps(trainer, STEPS)
    report = trainer.data.padding_report()
    assert report["tokens_after"] < report["tokens_before"], report  # rows really were packed
    return losses, [{k: v.numpy() for k, v in g.items()} for g in grads]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_packed_native_data_trains_like_unpacked_one_process(layout, tmp_path):
    data = manifest(tmp_path, several=True)
    reference = trainer_steps(Trainer(_config(tmp_path / "one", data)), STEPS)
    world, extra = LAYOUTS[layout]
    losses, grads = run_distributed(_rank, world, str(tmp_path / layout), data, extra, timeout=300)[0]
    assert_trains_like(f"packed native {layout}", (losses, grads), reference, 1e-5)
