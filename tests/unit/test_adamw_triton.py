"""MasterAdamW reading gradients through a table of addresses (`grad_table=True`) against torch's AdamW,
run by Triton's interpreter on the CPU: the same checks as the flat gradient buffer's in test_benchmark.py,
on a first layer large enough for whole blocks of the kernel and a partial one. On a GPU, test_gpu.py
compares the compiled kernel with torch's AdamW."""

import pytest
import torch

from mimo.perf.adamw_triton import TableUpdate
from mimo.perf.master_adamw import MasterAdamW
from tests.support.triton_interpreter import run_in_interpreter

CHECK = r"""
import torch
from mimo.perf.master_adamw import MasterAdamW
from mimo.perf.adamw_triton import BLOCK
from tests.support import master_adamw_checks as flat

assert BLOCK < 256 * 5 and (256 * 5) % BLOCK, "the first layer must fill whole blocks and a partial one"
# atol: a weight whose gradient comes near zero moves by rounding noise, amplified by Adam (the flat buffer's
# path too): 1% of one step (lr 1e-2)
flat.check_accumulated_hand_set_and_missing_gradients(inputs=256, atol=1e-4, grad_table=True)
flat.check_parameters_without_gradients_are_skipped(inputs=256, atol=1e-4, grad_table=True)

# no flat gradient buffer; bf16 weights are the rounded fp32 masters after a step
lin = torch.nn.Linear(64, 40)
opt = MasterAdamW(lin.parameters(), lr=1e-3, grad_table=True)
assert opt.grad is None
before = opt.master[:2560].clone()
lin(torch.randn(2, 64, dtype=torch.bfloat16)).sum().backward()
opt.step()
assert (opt.master[:2560] - before).abs().min() > 0.9e-3  # Adam's first step moves every weight by about lr
assert torch.equal(lin.weight, opt.master[:2560].view(40, 64).to(torch.bfloat16))
print("ok")
"""


def test_grad_table_update_matches_torch_adamw_in_the_interpreter():
    run_in_interpreter(CHECK)


def test_grad_table_refuses_what_it_cannot_do():
    lin = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="fresh_grads=False: use grad_table=False"):
        MasterAdamW(lin.parameters(), fresh_grads=False, grad_table=True)
    with pytest.raises(ValueError, match="not on cpu: use grad_table=False"):
        MasterAdamW(lin.parameters(), grad_table=True)  # this process did not start Triton's interpreter
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="power of two >= 64"):
        TableUpdate([10], [0], cpu, block=96)
    for grad in (torch.zeros(5)[1:], torch.zeros(4, dtype=torch.bfloat16)):  # 4 bytes into its storage; a bf16
        with pytest.raises(ValueError, match="pass it through aligned_grad"):  # gradient for fp32 weights
            TableUpdate([4], [0], cpu).addresses(0, 1, [grad], torch.float32)
