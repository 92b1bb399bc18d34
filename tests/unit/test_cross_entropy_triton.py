"""The Triton loss chunk against the PyTorch one, run by Triton's interpreter on the CPU (its own process:
the interpreter is chosen when the kernel is defined). On a GPU, test_gpu.py runs it compiled. Also how
`chunk_kernel` picks a chunk, and what a label outside the vocabulary gives."""

import math

import pytest
import torch

from mimo.models.loss import IGNORE_INDEX
from mimo.perf.linear_ce import chunk_kernel, chunk_loss_and_grad, chunk_loss_into_grad
from tests.support.triton_interpreter import run_in_interpreter

CHECK = r"""
import math
import torch
from mimo.perf import cross_entropy_triton, triton_support
from mimo.perf.linear_ce import linear_cross_entropy
from mimo.perf.linear_ce import chunk_loss_and_grad
from mimo.models.loss import IGNORE_INDEX

assert triton_support.unavailable(torch.device("cpu")) is None
torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    for block in (256, 4096):  # 1000 columns: a partial last block, and one block holding the whole row
        logits = (torch.randn(6, 1000) * 4).to(dtype)
        labels = torch.tensor([3, 0, 999, 7, IGNORE_INDEX, 5, 0, 9, 517, 1, 256, 2])[::2]  # strided: 3,999,...
        ref_loss, ref_grad = chunk_loss_and_grad(logits, labels)
        work = logits.clone()
        loss = cross_entropy_triton.chunk_loss_into_grad(work, labels, block=block)
        assert abs(float(loss) - float(ref_loss)) <= 1e-6 * abs(float(ref_loss)), (dtype, block, float(loss))
        err = float((work.float() - ref_grad.float()).abs().max())
        assert err <= tol * float(ref_grad.float().abs().max()), (dtype, block, err)
        assert not work[2].any(), "a row without a label must get a zero gradient"
        assert abs(float(work[0].float().sum())) < 1e-2, "softmax - onehot sums to zero over a row"
# a label outside the vocabulary: NaN loss and gradient row, never a read of another row
work = torch.randn(3, 300)
loss = cross_entropy_triton.chunk_loss_into_grad(work, torch.tensor([300, 4, -5]), block=128)
assert math.isnan(float(loss)) and work[0].isnan().all() and work[2].isnan().all() and work[1].isfinite().all()
# the whole head + loss through the Triton chunk, against the eager one
hidden, weight = torch.randn(50, 16), torch.randn(700, 16) * 0.3
labels = torch.randint(0, 700, (50,))
labels[::5] = IGNORE_INDEX
out = {}
for kernel in ("torch", "triton"):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, count = linear_cross_entropy(h, w, labels, chunk_rows=16, kernel=kernel)
    loss.backward()
    out[kernel] = (loss.detach(), h.grad, w.grad)
for a, b in zip(out["triton"], out["torch"]):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
print("ok")
"""


def test_triton_loss_chunk_matches_torch_chunk_in_the_interpreter():
    run_in_interpreter(CHECK)


def test_chunk_kernel_choices_on_the_cpu():
    cpu = torch.device("cpu")
    assert chunk_kernel("auto", cpu) is chunk_loss_into_grad and chunk_kernel("torch", cpu) is chunk_loss_into_grad
    with pytest.raises(ValueError, match="choose one of auto, torch, compiled, triton"):
        chunk_kernel("fused", cpu)
    with pytest.raises(ValueError, match="cannot run: .*use kernel 'compiled' or 'torch'"):
        chunk_kernel("triton", cpu)  # this process did not start Triton's interpreter


def test_a_label_outside_the_vocabulary_gives_nan_in_the_torch_chunk():
    loss, grad = chunk_loss_and_grad(torch.randn(3, 10), torch.tensor([10, IGNORE_INDEX, -3]))
    assert math.isnan(float(loss))
    assert grad[0].isnan().all() and grad[2].isnan().all() and not grad[1].any()
