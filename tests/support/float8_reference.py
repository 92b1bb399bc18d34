"""A CPU reference for torchao's FP8 linears, for tests of `precision.module_dtype.<m> = "float8"` off an FP8 GPU.

`QDQLinear` quantise-dequantises its input and weight through torch.float8_e4m3fn (the amax scaled to the
format's largest value; gradients pass straight through) and multiplies in their own dtype. `qdq_swap` swaps
it in as torchao's `convert_to_float8_training` swaps Float8Linear (same signature), recording each name in
`SWAPPED`; inside `with float8_reference():` `mimo train` uses it: the gate's FP8 device checks lifted, torchao's
swap replaced (in this process; a spawned rank enters it itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from mimo.perf import float8
from mimo.train import gate

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
SWAPPED: list[str] = []
"""The names `qdq_swap` swapped, in order, since `float8_reference` was last entered."""


def qdq(t: torch.Tensor, rowwise: bool = False) -> torch.Tensor:
    """`t` through float8_e4m3fn with one scale per tensor (per row of the last dim with `rowwise`), back in its
    dtype; the gradient passes straight through."""
    amax = t.detach().abs().amax(dim=-1, keepdim=True) if rowwise else t.detach().abs().amax()
    scale = E4M3_MAX / amax.float().clamp(min=1e-12)
    back = ((t.detach().float() * scale).to(torch.float8_e4m3fn).float() / scale).to(t.dtype)
    return t + (back - t).detach()


class QDQLinear(nn.Linear):
    """An FP8 linear's numerics on the CPU: input and weight quantise-dequantised, the product in their dtype.
    `rowwise` scales the input per row (then a row's result does not depend on the rest of the batch)."""

    rowwise = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(qdq(x.to(dtype), self.rowwise), qdq(self.weight.to(dtype)), bias)


def qdq_swap(root: nn.Module, keep, rowwise: bool = False) -> None:
    """torchao's swap with QDQLinear for Float8Linear: every nn.Linear below `root` the filter keeps, in place."""
    for fqn, parent in list(root.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{fqn}.{name}" if fqn else name
            if type(child) is nn.Linear and keep(child, full):
                new = QDQLinear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                new.weight, new.bias, new.rowwise = child.weight, child.bias, rowwise
                setattr(parent, name, new)
                SWAPPED.append(full)


@contextlib.contextmanager
def float8_reference(rowwise: bool = False) -> Iterator[list[str]]:
    """Inside it, this process's `mimo train` trains "float8" modules with QDQLinear (see the module docstring);
    yields SWAPPED, cleared first. Both patched functions are restored on leaving."""
    SWAPPED.clear()
    saved = gate.check_float8_support, float8.torchao_swap
    gate.check_float8_support = lambda cfg: None
    float8.torchao_swap = lambda recipe: (lambda root, keep: qdq_swap(root, keep, rowwise))
    try:
        yield SWAPPED
    finally:
        gate.check_float8_support, float8.torchao_swap = saved
