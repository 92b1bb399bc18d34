"""Each module's share of the step time, for summary.json's `time_share`: what the encoders and the LM each cost.

Every `metrics.time_share_every`-th step after `metrics.throughput_warmup` (this run's steps), the model's runtime
clock (`ModelRuntime.module_clock`, this `ModuleTime`) stamps four moments of each module's work, for every
microbatch: before its forward (a modality's encoders and input projections; the LM from its input embeddings to
its loss) and after it, and in backward where the gradient reaches the module's output and where the module's
backward is done. The last one has no tensor of its own (an encoder's inputs take no gradient): `start` makes
a scalar node in the autograd graph just before the module's first operation and `end` ties it to the module's
output; the autograd engine runs the nodes made later first, so that node runs once the module's whole backward
has. A module's time is the sum of its forward and backward spans, its share that time over the sum of every
module's. Other steps pass straight through (no stamp, no node).

Stamps are host clocks on the CPU, CUDA events on a GPU (no sync inside the step: a sampled step's events are
read at the next sample or at the end). Measured on each rank for the modules it runs through the model's
forward (colocated layouts: every module); summary.json gives rank 0's. A pipelined layout's stages call their
modules directly: no `time_share` there.
"""

from __future__ import annotations

import time

import torch


class _Start(torch.autograd.Function):
    """Forward: stamps the module's forward start; its backward, run after the module's, stamps the end."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, clock: ModuleTime, name: str) -> torch.Tensor:
        ctx.clock, ctx.name = clock, name
        clock.stamp(name, "forward_start")
        return anchor.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.clock.stamp(ctx.name, "backward_end")
        return None, None, None


class _End(torch.autograd.Function):
    """Identity on the module's output that stamps its forward end, and in backward the backward's start."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, token: torch.Tensor, clock: ModuleTime, name: str) -> torch.Tensor:
        ctx.clock, ctx.name, ctx.token = clock, name, (token.dtype, token.device)
        clock.stamp(name, "forward_end")
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.clock.stamp(ctx.name, "backward_start")
        dtype, device = ctx.token
        return grad, torch.zeros((), dtype=dtype, device=device), None, None


class ModuleTime:
    """The runtime's `ModuleClock` (mimo.models.runtime) and the tally of the sampled steps' module times."""

    def __init__(self, device: torch.device, every: int, warmup: int):
        self.device, self.every, self.warmup = device, every, warmup
        self.steps = 0
        self.armed = False
        self.anchor = torch.zeros((), device=device, requires_grad=True)
        self.stamps: dict[str, dict[str, list]] = {}  # module -> kind -> host times or CUDA events, in order
        self.seconds: dict[str, float] = {}

    def sample(self) -> bool:
        """Count one step of this run; whether it is timed (call before its forward)."""
        step, self.steps = self.steps, self.steps + 1
        self.armed = bool(self.every) and step >= self.warmup and (step - self.warmup) % self.every == 0
        if self.armed:
            self.settle()
        return self.armed

    def stamp(self, name: str, kind: str) -> None:
        """Record this moment of module `name`'s work: a CUDA event on the current stream, or the host clock."""
        if self.device.type == "cuda":
            at = torch.cuda.Event(enable_timing=True)
            at.record()
        else:
            at = time.perf_counter()
        self.stamps.setdefault(name, {}).setdefault(kind, []).append(at)

    def start(self, name: str) -> torch.Tensor | None:
        if not (self.armed and torch.is_grad_enabled()):
            return None
        return _Start.apply(self.anchor, self, name)

    def end(self, name: str, out: torch.Tensor, token: torch.Tensor | None) -> torch.Tensor:
        return out if token is None else _End.apply(out, token, self, name)

    def settle(self) -> None:
        """Add the stamped spans to the module times (on a GPU, waits for the last event of each)."""
        for name, kinds in self.stamps.items():
            for begin, finish in (("forward_start", "forward_end"), ("backward_start", "backward_end")):
                for a, b in zip(kinds.get(begin, []), kinds.get(finish, [])):
                    if self.device.type == "cuda":
                        b.synchronize()
                    seconds = a.elapsed_time(b) / 1e3 if self.device.type == "cuda" else b - a
                    self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.stamps.clear()

    def shares(self) -> dict[str, float]:
        """Each timed module's share of their summed time, to 4 digits; {} when no step was timed."""
        self.settle()
        total = sum(self.seconds.values())
        return {name: round(s / total, 4) for name, s in self.seconds.items()} if total else {}
