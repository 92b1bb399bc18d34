"""An anyres run on a JSONL manifest (tests.unit.test_anyres_data: images of five sizes, a sample of two images, a
text-only one, a missing image and a video, both skipped) on 2 gloo ranks: data parallel (replicated and FSDP2)
and the colocated fan-in (tower dp2 into LM tp2, each rank encoding the tiles of its own lane's images only) give
the single process's losses and gradients within 1e-5 relative over two Trainer steps; every rank's batch holds
every row's placeholders as the single process's does, whichever rows it reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.train.trainer import Trainer
from tests.support.anyres_data import jsonl
from tests.support.dist import run_distributed
from tests.support.native_data import batch_facts
from tests.support.parity import assert_trains_like, tiny_trainer_steps
from tests.support.tiny_run import tiny_config

RTOL = 1e-5
STEPS = 2
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
COMMON = ["--model.llm.layers=2", "--model.llm.heads=4", "--model.llm.kv_heads=2", "--optim.eps=1e-2",
          "--data.seed=1"]
LAYOUTS = {"dp2": [], "dp2_fsdp": [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"], "fan_in2": [f"{LANG}.tp=2"]}


def _train(out: Path, data: list[str], *overrides: str) -> tuple[list[float], list[dict]]:
    return tiny_trainer_steps(out, STEPS, *data, *COMMON, *overrides)


def _rank(rank: int, world: int, out: str, data: list[str], layout: list[str]) -> tuple[list[float], list[dict]]:
    return _train(Path(out), data, *layout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_anyres_manifest_trains_like_one_process(tmp_path, layout):
    data = jsonl(tmp_path)
    reference = _train(tmp_path / "one", data)
    losses, grads = run_distributed(_rank, 2, str(tmp_path / layout), data, LAYOUTS[layout], timeout=300)[0]
    assert_trains_like(f"anyres jsonl {layout}", (losses, grads), reference, RTOL)
    assert "modality_submodules.images.image_newline" in grads[0]


def _facts(rank: int, world: int, out: str, data: list[str]) -> tuple:
    return batch_facts(Trainer(tiny_config(Path(out), *data, *COMMON)))


def test_every_rank_holds_every_rows_placeholders(tmp_path):
    """A rank that reads neither a row's text nor its image still holds its placeholders (from the image's header),
    as the single process does."""
    data = jsonl(tmp_path)
    reference = batch_facts(Trainer(tiny_config(tmp_path / "one", *data, *COMMON)))
    for rank, facts in enumerate(run_distributed(_facts, 2, str(tmp_path / "dp2"), data, timeout=300)):
        assert facts == reference, f"rank {rank}"
