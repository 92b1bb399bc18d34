"""Every 2-rank layout, trained through `mimo train` on two GPUs over NCCL, has the loss curve of the same
config on one GPU at every one of 20 steps: within 1e-4 relative in float32 (as the gloo CLI test), within
1e-3 in bfloat16 (ten times the largest gap measured on H200s, 1.0e-4; BENCHMARKS.md).

Marked `gpu` and skipped with fewer than 2 GPUs. The tensor-by-tensor parity suites run on NCCL too:

    MIMO_TEST_BACKEND=nccl python3 -m pytest -q tests/distributed/test_colocated.py \
        tests/distributed/test_pipeline.py ...
    python3 -m pytest -q tests/gpu/test_multi_gpu.py
"""

import functools
import math
from pathlib import Path

import pytest
import torch

from tests.support.cli_curve import loss_curve

LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
# layout name: (config, overrides); demo_packed's curve equals demo_vlm's (see test_parallel_cli)
LAYOUTS = {
    "dp2": ("demo_vlm.toml", []),
    "dp2 fsdp": ("demo_vlm.toml", [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"]),
    "tp2 + sp": ("demo_vlm.toml", [f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true", f"{IMG}.tp=2"]),
    "fan-in: encoder dp2, LM tp2": ("demo_vlm.toml", [f"{LANG}.tp=2"]),
    "fan-out: encoder tp2, LM dp2": ("demo_vlm.toml", [f"{IMG}.tp=2"]),
    "LM cp2": ("demo_vlm.toml", [f"{LANG}.cp=2"]),
    "pipeline: encoder rank 0, LM rank 1": ("demo_vlm.toml", [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1",
                                                               f"{LANG}.size=1", "--parallel.microbatches=4"]),
    "colocated pipeline: encoder dp2, LM pp2": ("demo_vlm.toml", [f"{IMG}.tp=1", f"{LANG}.pp=2",
                                                                   "--parallel.microbatches=4"]),
    "packed dp2": ("demo_packed.toml", []),
}
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-3}
DTYPES = tuple(TOLERANCE)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]


def _train(out: Path, name: str, config: str, overrides: list[str], nproc: int, dtype: str) -> list[float]:
    return loss_curve(out, name, config, nproc, "--train.device=cuda", "--perf.gpu_defaults=false",
                      f"--precision.dtype={dtype}", *overrides, timeout=600)


@functools.cache
def _one_gpu(out: Path, dtype: str) -> tuple[float, ...]:
    return tuple(_train(out, f"one_gpu_{dtype}", "demo_vlm.toml", [], 1, dtype))


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("multi_gpu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_gpu_layout_reproduces_the_one_gpu_loss_curve(out, layout, dtype):
    config, overrides = LAYOUTS[layout]
    name = f"{layout.split(':')[0].replace(' ', '_')}_{dtype}"
    losses = _train(out, name, config, overrides, 2, dtype)
    reference, tol = _one_gpu(out, dtype), TOLERANCE[dtype]
    assert len(losses) == len(reference) == 20
    gaps = [abs(a - b) / abs(b) for a, b in zip(losses, reference)]
    print(f"{layout} {dtype}: worst relative loss gap {max(gaps):.2e} (tolerance {tol:.0e})")
    for step, (a, b, gap) in enumerate(zip(losses, reference, gaps)):
        assert math.isfinite(a) and gap <= tol, f"{layout} {dtype} step {step}: {a} vs one GPU {b}"
