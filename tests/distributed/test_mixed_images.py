"""Samples with 0..3 images each (`data.min_images_per_sample = 0`, `data.images_per_sample = 3` on the shapes
demo): text-only samples, several images per sample, and data lanes that see no image at all. On the colocated
fan-in (encoder dp4 into LM tp2 x dp2, 4 ranks) and the 3-rank pipeline (encoder on rank 0, LM pp2 on ranks 1-2,
2 microbatches), and on the encoder FSDP2-sharded over ranks 0-1 (a lane of a microbatch with no image runs a zero
stand-in to join the collectives) feeding the LM pp2 on ranks 2-3, two `Trainer` steps give the single-process
losses, gradients and weights after the last step within 1e-5 relative. So do they
with every image tiled as LLaVA-NeXT tiles it (an anyres run, tests.support.anyres_run) on 2 ranks of data
parallelism (replicated and FSDP2) and on the colocated fan-in (tower dp2 into LM tp2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.anyres_run import ANYRES
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, assert_weights_like, trainer_steps
from tests.support.tiny_run import MIXED_IMAGES, tiny_config

RTOL = 1e-5
STEPS = 2
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
LAYOUTS = {
    "fan_in4": (4, [f"{LANG}.tp=2"]),
    "pipeline3": (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2",
                      "--parallel.microbatches=2"]),
    # The encoder FSDP2-sharded over its 2 lanes on ranks 0-1 (one lane of a microbatch has no image: it runs its
    # zero stand-in), the LM pp2 on ranks 2-3.
    "pipeline_fsdp4": (4, [f"{IMG}.offset=0", f"{IMG}.size=2", f"{IMG}.fsdp=true", f"{LANG}.offset=2",
                           f"{LANG}.size=2", f"{LANG}.pp=2", "--parallel.microbatches=2"]),
}
ANYRES_LAYOUTS = {"dp2": [], "dp2_fsdp": [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"], "fan_in2": [f"{LANG}.tp=2"]}


def _train(out: Path, *overrides: str) -> tuple[list[float], list[dict], dict]:
    """Each step's loss and gradients, then the weights after the last step (unsharded; on rank 0 under a layout)."""
    trainer = Trainer(tiny_config(out, *MIXED_IMAGES, *overrides))
    losses, grads = trainer_steps(trainer, STEPS)
    weights = trainer.plan.gather_full(trainer.model)
    grads = [{n: g.numpy() for n, g in step.items()} for step in grads]
    return losses, grads, {n: w.numpy() for n, w in weights.items()}


def _rank(rank: int, world: int, out: str, layout: list[str]) -> tuple[list[float], list[dict], dict]:
    return _train(Path(out), *layout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[float], list[dict], dict]:
    threads = torch.get_num_threads()
    yield _train(tmp_path_factory.mktemp("single"))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def anyres_reference(tmp_path_factory) -> tuple[list[float], list[dict], dict]:
    threads = torch.get_num_threads()
    yield _train(tmp_path_factory.mktemp("single_anyres"), *ANYRES)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mixed_images_train_like_single_process(reference, tmp_path, layout):
    world, overrides = LAYOUTS[layout]
    losses, grads, weights = run_distributed(_rank, world, str(tmp_path), overrides, timeout=600)[0]
    assert_trains_like(layout, (losses, grads), reference[:2], RTOL)
    assert_weights_like(f"{layout} after step {STEPS}", weights, reference[2], RTOL)


@pytest.mark.parametrize("layout", list(ANYRES_LAYOUTS))
def test_anyres_images_train_like_single_process(anyres_reference, tmp_path, layout):
    losses, grads, _ = run_distributed(_rank, 2, str(tmp_path), [*ANYRES, *ANYRES_LAYOUTS[layout]], timeout=600)[0]
    assert_trains_like(f"anyres {layout}", (losses, grads), anyres_reference[:2], RTOL)
    assert "modality_submodules.images.image_newline" in grads[0]
