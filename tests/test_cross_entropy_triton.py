"""The Triton loss chunk against the PyTorch one, run by Triton's interpreter on the CPU (its own process:
the interpreter is chosen when the kernel is defined). On a GPU, test_gpu.py runs it compiled."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import torch
from mimo.perf import cross_entropy_triton
from mimo.perf.linear_ce import chunk_loss_and_grad
from mimo.train.loss import IGNORE_INDEX

assert cross_entropy_triton.available(torch.device("cpu"))
torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    logits = (torch.randn(6, 1000) * 4).to(dtype)   # 1000: not a multiple of the block
    labels = torch.tensor([3, 999, IGNORE_INDEX, 0, 517, 256])
    ref_loss, ref_grad = chunk_loss_and_grad(logits, labels)
    work = logits.clone()
    loss = cross_entropy_triton.chunk_loss_into_grad(work, labels, block=256)
    assert abs(float(loss) - float(ref_loss)) <= 1e-6 * abs(float(ref_loss)), (dtype, float(loss), float(ref_loss))
    err = float((work.float() - ref_grad.float()).abs().max())
    assert err <= tol * float(ref_grad.float().abs().max()), (dtype, err)
    assert not work[2].any(), "a row without a label must get a zero gradient"
    assert abs(float(work[0].float().sum())) < 1e-2, "softmax - onehot sums to zero over a row"
print("ok")
"""


def test_triton_loss_chunk_matches_torch_chunk_in_the_interpreter():
    pytest.importorskip("triton", reason="Triton is part of the dev extra on Linux")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
