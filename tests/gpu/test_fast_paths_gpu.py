"""Every fast path at once (`perf.compile` with inductor, `perf.chunked_loss`, `perf.fuse_qkv`, activation
checkpointing of both modules), trained through `mimo train` on two GPUs over NCCL on each 2-rank layout, has the
loss curve of the plain fp32 run on one GPU at every one of 20 steps, within 1e-4 relative (as the gloo layout
tests' curves; inductor reorders fp32 sums): on GPUs compiled blocks run inductor's kernels around NCCL's
functional collectives and the vocab-parallel loss chunk its compiled kernel, which the CPU suite
(tests/test_fast_path_layouts.py, aot_eager) does not. Marked `gpu`, skipped with fewer than 2 GPUs."""

import functools
import math
from pathlib import Path

import pytest
import torch

from tests.support.cli_curve import loss_curve

LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
LAYOUTS = {
    "tp2 + sp": [f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true", f"{IMG}.tp=2"],
    "fsdp": [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"],
    "LM cp2": [f"{LANG}.cp=2"],
    "fan-in: encoder dp2, LM tp2": [f"{LANG}.tp=2"],
    "pipeline: encoder rank 0, LM rank 1": [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=1",
                                            "--parallel.microbatches=4"],
}
FAST = ["--perf.compile=true", "--perf.chunked_loss=true", "--perf.fuse_qkv=true",
        '--perf.activation_checkpointing=["language", "images"]']
RTOL = 1e-4

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fast_paths_gpu")


@functools.cache
def _one_gpu_plain(out: Path) -> tuple[float, ...]:
    return tuple(loss_curve(out, "one_gpu_plain", "demo_vlm.toml", 1, "--train.device=cuda",
                            "--perf.gpu_defaults=false", timeout=600))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_fast_path_on_two_gpus_follows_the_one_gpu_plain_curve(out, layout):
    name = layout.split(":")[0].replace(" ", "_").replace("+", "")
    losses = loss_curve(out, f"fast_{name}", "demo_vlm.toml", 2, "--train.device=cuda", "--perf.gpu_defaults=false",
                        *FAST, *LAYOUTS[layout],
                        timeout=900)
    reference = _one_gpu_plain(out)
    assert len(losses) == len(reference) == 20
    for step, (a, b) in enumerate(zip(losses, reference)):
        assert math.isfinite(a) and abs(a - b) <= RTOL * abs(b), f"{layout} step {step}: {a} vs one GPU plain {b}"
