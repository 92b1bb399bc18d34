"""`precision.module_dtype = "float8"` for both modules composes with the layouts and compilation it is installed
among: data parallelism and FSDP2 of both modules over 2 ranks, alone and with every block compiled (aot_eager),
and the 3-rank pipeline, train like the single-process run of the same config. torchao's Float8Linear is
replaced by the CPU reference of tests/support/float8_reference.py, its input scaled per row so that a row's
product does not depend on which lane holds the rest of the batch. Two steps each: both losses within 1e-4
relative (step 0 exact, step 1 3.7e-5 seen), the first step's gradients (gathered whole) within 1e-2 (bf16
autocast rounds each lane's partial weight gradients: 2.1e-3 seen; after an update the weights' per-tensor
scales move every FP8 rounding, 1.8e-2 seen on step 1, so those are not compared), and every rank swapped
exactly the linears the single process swapped (the pipeline's ranks together, each its own stage's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.float8_reference import float8_reference
from tests.support.parity import assert_trains_like, trainer_steps
from tests.support.tiny_run import tiny_config

STEPS = 2
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
FLOAT8 = ["--precision.dtype=bfloat16", "--precision.module_dtype.language=float8",
          "--precision.module_dtype.images=float8", "--model.llm.layers=2", "--model.llm.heads=4",
          "--model.llm.kv_heads=2", "--optim.eps=1e-2"]
LAYOUTS = {"dp2": [], "fsdp2": [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"]}
PIPELINE3 = [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2"]
COMPILE = ["--perf.compile=true", "--perf.compile_backend=aot_eager"]


def _train(out: Path, *overrides: str) -> tuple[list[float], list[dict], list[str]]:
    with float8_reference(rowwise=True) as swapped:
        trainer = Trainer(tiny_config(out, *FLOAT8, *overrides))
        losses, grads = trainer_steps(trainer, STEPS)
        return losses, [{n: g.float().numpy() for n, g in step.items()} for step in grads], sorted(swapped)


def _rank(rank: int, world: int, out: str, overrides: list[str]) -> tuple:
    return _train(Path(out) / f"rank{rank}", *overrides)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple:
    threads = torch.get_num_threads()
    yield _train(tmp_path_factory.mktemp("single"))
    torch.set_num_threads(threads)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_float8_modules_train_like_single_process(reference, tmp_path, layout, compiled):
    overrides = [*LAYOUTS[layout], *(COMPILE if compiled else [])]
    ranks = run_distributed(_rank, 2, str(tmp_path), overrides, timeout=600)
    ref_losses, ref_grads, ref_swapped = reference
    assert len(ref_swapped) == 2 * 7 + 6 + 2  # LM layers' 7 projections each; the ViT block's 6; the projector's 2
    assert all(r[2] == ref_swapped for r in ranks)
    losses, grads, _ = ranks[0]
    assert all(abs(a - b) <= 1e-4 * b for a, b in zip(losses, ref_losses, strict=True)), (losses, ref_losses)
    assert_trains_like(f"{layout} compiled={compiled}", (losses[:1], grads[:1]), (ref_losses[:1], ref_grads[:1]),
                       rtol=1e-2)


def test_float8_modules_on_the_pipeline_convert_each_stage_and_train_like_single_process(tmp_path_factory):
    """The encoder on rank 0, the LM pp2 on ranks 1-2: each rank swaps the linears of the stage it holds (the
    linears a stage released stay), together exactly the single process's, and the run trains like it."""
    micro = "--parallel.microbatches=2"
    ref_losses, ref_grads, ref_swapped = _train(tmp_path_factory.mktemp("single"), micro)
    ranks = run_distributed(_rank, 3, str(tmp_path_factory.mktemp("pipe")), [*PIPELINE3, micro], timeout=600)
    swapped = [r[2] for r in ranks]
    assert [len(s) for s in swapped] == [8, 7, 7] and sorted(sum(swapped, [])) == ref_swapped
    losses, grads, _ = ranks[0]
    assert all(abs(a - b) <= 1e-4 * b for a, b in zip(losses, ref_losses, strict=True)), (losses, ref_losses)
    assert_trains_like("pipeline3", (losses[:1], grads[:1]), (ref_losses[:1], ref_grads[:1]), rtol=1e-2)
