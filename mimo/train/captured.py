"""`perf.step_graph`: the whole training step (forward, backward, optimizer) as one CUDA graph.

The first WARMUP_STEPS steps run eagerly on the capture stream (they compile, autotune and initialise
lazily); the next one records the step once on a copy of its microbatches, whose tensors become the
graph's inputs, and replays it; every later step copies its microbatches into those inputs and replays.
The GPU then never waits for Python. The capture stream has the highest priority, so that MasterAdamW's
early update (a side stream of the lowest) takes only the SMs the encoders' backward leaves free: PyTorch
instantiates graphs with cudaGraphInstantiateFlagUseNodePriority, so every kernel node keeps the priority of
the stream it was captured on.

What a captured step may not do (config/validate.py refuses it before the first step): wait for the device
on the host, clip by a norm the host reads, skip a step. A batch of other shapes than the captured one is
refused, naming the key.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

WARMUP_STEPS = 2


def flat_tensors(tree: dict, prefix: str = "") -> dict[str, object]:
    """Every leaf of a nested dict by dotted name (tensors and anything else, e.g. ints)."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat_tensors(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def clone_tree(tree: dict) -> dict:
    return {k: clone_tree(v) if isinstance(v, dict) else v.clone() if isinstance(v, torch.Tensor) else v
            for k, v in tree.items()}


class CapturedStep:
    """`fn(microbatches) -> tuple of tensors` run as described in the module docstring; call it like `fn`.
    Returns fresh copies of the outputs (the graph's own are overwritten by the next replay)."""

    def __init__(self, fn: Callable[[list[dict]], tuple[torch.Tensor, ...]], device: torch.device):
        self.fn = fn
        self.stream = torch.cuda.Stream(device, priority=-100)  # clamped to the highest priority
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0
        self.inputs: list[dict] = []
        self.outputs: tuple[torch.Tensor, ...] = ()

    def __call__(self, micro: list[dict]) -> tuple[torch.Tensor, ...]:
        if self.graph is None and self.eager_steps < WARMUP_STEPS:
            self.eager_steps += 1
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                out = self.fn(micro)
            torch.cuda.current_stream().wait_stream(self.stream)
            return out
        if self.graph is None:
            self.capture(micro)
        else:
            self.copy_in(micro)
        self.graph.replay()
        return tuple(t.clone() for t in self.outputs)

    def capture(self, micro: list[dict]) -> None:
        """Record one step on a copy of `micro`. The warm-up's cached memory is released first: the graph
        allocates from a pool of its own."""
        self.inputs = [clone_tree(mb) for mb in micro]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.graph = torch.cuda.CUDAGraph()
        # "thread_local": only this thread's calls are checked for capture safety, not autograd's backward
        # thread's; a sync on the captured stream fails the capture in any mode
        with torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode="thread_local"):
            self.outputs = self.fn(self.inputs)

    def copy_in(self, micro: list[dict]) -> None:
        if len(micro) != len(self.inputs):
            raise ValueError(f"perf.step_graph: this step has {len(micro)} microbatches, the captured one "
                             f"{len(self.inputs)}")
        for new, old in zip(micro, self.inputs):
            mine, theirs = flat_tensors(old), flat_tensors(new)
            if mine.keys() != theirs.keys():
                raise ValueError(f"perf.step_graph: the batch holds {sorted(theirs)}, the captured step was "
                                 f"recorded with {sorted(mine)}; set perf.step_graph = false for such data")
            for name, t in mine.items():
                other = theirs[name]
                same = (t.shape == other.shape and t.dtype == other.dtype) if isinstance(t, torch.Tensor) \
                    else t == other
                if not same:
                    raise ValueError(f"perf.step_graph: batch entry {name} is {_describe(other)}, but the step "
                                     f"was captured with {_describe(t)}: a CUDA graph replays fixed shapes; set "
                                     "perf.step_graph = false for data whose shapes change")
            for name, t in mine.items():
                if isinstance(t, torch.Tensor):
                    t.copy_(theirs[name], non_blocking=True)


def _describe(value: object) -> str:
    return f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else repr(value)
