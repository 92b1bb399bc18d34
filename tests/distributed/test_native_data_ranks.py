"""Native-resolution data on several ranks: images of four sizes, a video, a sample of two images, a text-only one
and a skipped sample train with the single process's losses and gradients on colocated layouts (two data lanes,
plain, cost-balanced or FSDP; the LM under tp2 with sequence parallel, or cp2, with M-RoPE) and a non-colocated one
(the tower on one rank, the LM on another: the LM's rank reads only image headers, the tower's only pixels, and the
pipeline bridge carries each sample's own number of rows), also with Qwen2-VL's vision markers around each item."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.config.load import load_config
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, trainer_steps
from tests.unit.test_native_data import TINY, manifest

STEPS = 2
MARKS = ["--model.modalities.images.native.vision_start_token_id=262",
         "--model.modalities.images.native.vision_end_token_id=263"]  # Qwen2-VL's markers around every item
TOWER_THEN_LM = ["--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
                 "--parallel.modules.language.offset=1", "--parallel.modules.language.size=1"]
LAYOUTS = {
    "colocated_dp2": [],
    "balanced_dp2": ["--data.balance_lanes=true"],
    "fsdp_dp2": ["--parallel.modules.images.fsdp=true", "--parallel.modules.language.fsdp=true"],
    "lm_cp2": ["--parallel.modules.language.cp=2"],
    "lm_tp2_sp": ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true"],
    "tower_then_lm": TOWER_THEN_LM,
    "tower_then_lm_marked": [*TOWER_THEN_LM, *MARKS],
}


def config(out: Path, data: str, *extra: str):
    overrides = [*TINY, f"--data.path={data}", f"--run.out_dir={out}", "--optim.eps=1e-2", "--optim.warmup_steps=0",
                 "--model.llm.kv_heads=2", *extra]
    return load_config(CONFIGS / "native_qwen2_5_vl.toml", overrides)


def _rank(rank: int, world: int, out: str, data: str, extra: list[str]) -> tuple:
    losses, grads = trainer_steps(Trainer(config(Path(out), data, *extra)), STEPS)
    return losses, [{k: v.numpy() for k, v in g.items()} for g in grads]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_native_data_trains_like_one_process(layout, tmp_path):
    data = manifest(tmp_path, several=True)
    reference = trainer_steps(Trainer(config(tmp_path / "one", data, *[x for x in LAYOUTS[layout] if x in MARKS])),
                              STEPS)
    results = run_distributed(_rank, 2, str(tmp_path / layout), data, LAYOUTS[layout], timeout=300)
    losses, grads = results[0]
    assert_trains_like(layout, (losses, grads), reference, 1e-5)
