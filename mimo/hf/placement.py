"""Where and in what dtype an imported module lives: the checkpoint's dtype (`"auto"`) or a chosen one, on
a chosen device, the meta device included (shapes only, nothing read: for a layout that materialises its
own pieces later).

The module is built straight on its device in its final dtype with initialisation skipped: its storage is
allocated but never written until each tensor is filled once from the checkpoint, so the peak is the model in
its final dtype, never an fp32 copy beside it nor a random initialisation that is then overwritten. (Not
through the meta device: its first initialisation call imports torch's Python meta kernels, about 150 MB
resident, as much as the checkpoint's largest tensors.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from mimo.hf.files import WeightSource

M = TypeVar("M", bound=nn.Module)
DTypeSpec = torch.dtype | str
DeviceSpec = torch.device | str


def resolve_dtype(dtype: DTypeSpec, src: WeightSource, anchor: str) -> torch.dtype:
    """`"auto"`: the dtype `src` stores the tensor `anchor` in (fp32 for a non-float one); a torch dtype or its
    name ("bfloat16", "float32", ...) as given."""
    if dtype == "auto":
        stored = src.dtype_of(anchor)
        return stored if stored.is_floating_point else torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype = {dtype!r} is not a floating-point torch dtype; pass 'auto' (the checkpoint's), "
                         "torch.bfloat16, 'float32', ...")
    return dtype


def is_meta(device: DeviceSpec) -> bool:
    return torch.device(device).type == "meta"


class SkippedInit(TorchFunctionMode):
    """Inside it, the in-place fills that `nn.init` and modules' `reset_parameters` use return their tensor
    untouched: a module built inside has uninitialised (unwritten) storage."""

    # nn.init's functions hand themselves to the mode whole (handle_torch_function), so they are listed too.
    FILLS = frozenset({torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_,
                       nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_, nn.init.zeros_, nn.init.ones_,
                       nn.init.constant_, nn.init.kaiming_uniform_, nn.init.kaiming_normal_,
                       nn.init.xavier_uniform_, nn.init.xavier_normal_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FILLS:
            return args[0] if args else (kwargs or {})["tensor"]
        return func(*args, **(kwargs or {}))


def empty_module(make: Callable[[], M], dtype: torch.dtype, device: DeviceSpec) -> M:
    """`make()` in `dtype` on `device` with uninitialised storage (on meta: no storage at all). Every
    parameter must be filled afterwards (load_hf_weights checks that each is mapped)."""
    if is_meta(device):
        with torch.device("meta"):
            return make().to(dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), SkippedInit():
            module = make()
    finally:
        torch.set_default_dtype(previous)
    return module.to(dtype)
