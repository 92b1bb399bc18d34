"""A JSONL manifest of image and text-only samples (tests.support.text_only_data: captions and chats with an image,
chats and a caption without one, a chat that writes `<image>` without an image, skipped) on 2 gloo ranks, each
rank decoding only its share: the images and the LM both dp2 (the first step's lane 0 is text-only), replicated and
FSDP2 (that lane's encoder runs a zero stand-in to join the collectives), the colocated fan-in (images dp2 into LM
tp2), and the pipelined encoder rank (images on rank 0, the LM on rank 1, 2 microbatches: the first step's first one
is text-only) give the single unpacked process's losses and gradients within 1e-5 relative over two Trainer steps;
so does dp2 with the samples packed (every rank reads the whole batch and trains its lane's packed rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.data.batching import COUNTS
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, tiny_trainer_steps
from tests.support.text_only_data import data_overrides, mixed_manifest
from tests.support.tiny_run import tiny_config

RTOL = 1e-5
STEPS = 2
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
COMMON = ["--model.llm.layers=2", "--model.llm.heads=4", "--model.llm.kv_heads=2", "--optim.eps=1e-2",
          "--data.seed=2", "--data.global_batch=4"]
LAYOUTS = {"dp2": [], "dp2_fsdp": [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"], "fan_in2": [f"{LANG}.tp=2"],
           "dp2_packed": ["--data.packing=true", "--data.pack_length=80"],
           "pipeline2": [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=1",
                         "--parallel.microbatches=2"]}


def _train(out: Path, data: list[str], *overrides: str) -> tuple[list[float], list[dict]]:
    return tiny_trainer_steps(out, STEPS, *data, *COMMON, *overrides)


def _rank(rank: int, world: int, out: str, data: list[str], layout: list[str]) -> tuple[list[float], list[dict]]:
    return _train(Path(out), data, *layout)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> list[str]:
    path, _ = mixed_manifest(tmp_path_factory.mktemp("data"))
    return data_overrides(path)


@pytest.fixture(scope="module")
def reference(manifest, tmp_path_factory) -> tuple[list[float], list[dict]]:
    return _train(tmp_path_factory.mktemp("one"), manifest)


def test_the_first_step_holds_a_text_only_lane(manifest, tmp_path):
    data = Trainer(tiny_config(tmp_path, *manifest, *COMMON)).data
    counts = data.global_batch(0, 4, 2)[COUNTS]["images"]
    assert counts.tolist() == [0, 0, 1, 1]  # rows 0-1 (a dp2 lane, a pipeline microbatch) are text-only


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_text_only_samples_train_like_one_process(manifest, reference, tmp_path, layout):
    losses, grads = run_distributed(_rank, 2, str(tmp_path), manifest, LAYOUTS[layout], timeout=300)[0]
    assert_trains_like(f"text-only jsonl {layout}", (losses, grads), reference, RTOL)
