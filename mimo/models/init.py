"""Initialisation by parameter name: every parameter's initial value is a function of one seed and its
name, so any rank can make exactly the part it holds, whatever the layout, and the result equals the
single-process model bit for bit.

Model code declares each parameter's rule where it initialises it (`normal_`, `zeros_`, `ones_`, `fixed_`):
on a real device the rule is applied at once from the torch RNG (a module built directly keeps its old
behaviour); on the meta device it is only recorded. `init_specs` reads the rules of a model built on meta
(full shapes, before any layout cuts it) and `materialize` then fills a model's meta parameters one at a
time: each parameter's full tensor is drawn on the CPU from a generator seeded by (seed, name), and only the
piece the caller's `local_view` names is kept, so the peak is one full tensor, never the model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

INIT_RULE = "_mimo_init_rule"
"""Parameter attribute: (rule, std or a zero-argument function giving the full value)."""

INIT_SPECS = "_mimo_init_specs"
"""MimoModel attribute set by the builder on meta: {parameter name: ParamInit}."""

Index = tuple[slice, ...]
LocalView = Callable[[str, torch.Tensor], tuple[Index, torch.Tensor]]
"""(name, parameter) -> (the index of this rank's piece in the full tensor, the tensor to fill with it)."""


def _mark(p: torch.Tensor | None, rule: str, arg: float | Callable[[], torch.Tensor] = 0.0) -> None:
    if p is not None:
        setattr(p, INIT_RULE, (rule, arg))


def normal_(p: torch.Tensor, std: float) -> None:
    _mark(p, "normal", std)
    if not p.is_meta:
        nn.init.normal_(p, std=std)


def zeros_(p: torch.Tensor | None) -> None:
    _mark(p, "zeros")
    if p is not None and not p.is_meta:
        nn.init.zeros_(p)


def ones_(p: torch.Tensor) -> None:
    _mark(p, "ones")
    if not p.is_meta:
        nn.init.ones_(p)


def fixed_(p: torch.Tensor, value: Callable[[], torch.Tensor]) -> None:
    """A parameter with a computed, not random, value (e.g. sinusoidal positions)."""
    _mark(p, "fixed", value)
    if not p.is_meta:
        with torch.no_grad():
            p.copy_(value())


@dataclass(frozen=True)
class ParamInit:
    """How to make one parameter's full initial tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    rule: str
    arg: float | Callable[[], torch.Tensor]
    seed: int

    def full(self) -> torch.Tensor:
        """The whole initial tensor on the CPU; the same on every process for the same (seed, name)."""
        if self.rule == "fixed":
            return self.arg().to(self.dtype)
        if self.rule in ("zeros", "ones"):
            return (torch.zeros if self.rule == "zeros" else torch.ones)(self.shape, dtype=self.dtype, device="cpu")
        g = torch.Generator(device="cpu").manual_seed(self.seed)
        return torch.empty(self.shape, dtype=self.dtype, device="cpu").normal_(0.0, self.arg, generator=g)


def parameter_seed(base: int, name: str) -> int:
    """A 63-bit seed for parameter `name` of a model seeded with `base` (stable across processes)."""
    digest = hashlib.sha256(f"{base}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _default_rule(owner: nn.Module, key: str) -> tuple[str, float]:
    """Norm layers keep PyTorch's unit weight and zero bias unless their model said otherwise."""
    if isinstance(owner, nn.LayerNorm) or type(owner).__name__ == "RMSNorm":
        identity = "zeros" if getattr(owner, "offset", False) else "ones"  # Gemma's norms scale by 1 + weight
        return (identity, 0.0) if key == "weight" else ("zeros", 0.0)
    raise AssertionError(f"{type(owner).__name__}.{key} has no initialisation rule (mimo.models.init)")


def init_specs(model: nn.Module, base_seed: int) -> dict[str, ParamInit]:
    """{name: ParamInit} of every parameter of a full model (shapes as built, before any layout)."""
    specs = {}
    for mname, owner in model.named_modules():
        for key, p in owner.named_parameters(recurse=False):
            name = f"{mname}.{key}" if mname else key
            rule, arg = getattr(p, INIT_RULE, None) or _default_rule(owner, key)
            specs[name] = ParamInit(tuple(p.shape), p.dtype, rule, arg, parameter_seed(base_seed, name))
    return specs


def draw_base_seed() -> int:
    """One draw from the global torch RNG: what a model's weights depend on (torch.manual_seed before)."""
    return int(torch.randint(0, 2**62, (1,), device="cpu").item())


def whole(name: str, p: torch.Tensor) -> tuple[Index, torch.Tensor]:
    """The `LocalView` of a single-process model: every parameter whole."""
    return (), p


def is_on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def materialize(model: nn.Module, specs: dict[str, ParamInit], device: torch.device | str = "cpu",
                local_view: LocalView = whole) -> None:
    """Allocate `model`'s meta parameters on `device` (its own piece only, e.g. after `to_empty` a DTensor's
    local shard) and fill each from its full initial tensor, one parameter at a time. Not collective.
    Every parameter must be on meta (a model is materialised once, as a whole). Buffers with a rule (zeros, ones,
    fixed) are made whole on `device`."""
    if not all(p.is_meta for p in model.parameters()):
        raise ValueError("materialize needs a model whose parameters are all on the meta device")
    buffer_rules = {name: getattr(b, INIT_RULE) for name, b in model.named_buffers() if hasattr(b, INIT_RULE)}
    model.to_empty(device=device)
    for name, b in model.named_buffers():
        if name in buffer_rules:  # a buffer is whole on every rank (e.g. the MoE router's balancing bias)
            rule, arg = buffer_rules[name]
            b.copy_(ParamInit(tuple(b.shape), b.dtype, rule, arg, 0).full())
    with torch.no_grad():
        for name, p in model.named_parameters():
            index, target = local_view(name, p)
            if target.numel():
                target.copy_(specs[name].full()[index])
