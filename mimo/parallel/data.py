"""Data parallelism for one module on its DP group: replicated (bucketed all-reduce) or sharded (FSDP2).

Both reduce gradients with a plain SUM, never a mean: every rank has already scaled its loss sum by
1/N_global (the global loss-token count, SPEC 3.1), so the sum over DP ranks is the gradient of the
global per-token loss.

Per step, after the last microbatch's backward:
- replicated: `GradReducer.reduce()` once per module;
- FSDP2: gradients are reduce-scattered during backward; `AbsentInputFiller.finish()` if some
  microbatch may lack a modality;
- then `MimoOptimizer.step`, whose `norm_sq_reduce` is `norm_sq_reducer(...)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from mimo.models.multimodal import BLOCK_STACKS, MimoModel, MimoOutput
from mimo.parallel.comm import collective_device

ModalityInputs = dict[str, dict[str, dict[str, torch.Tensor]]]
NormReducer = Callable[[dict[str, torch.Tensor]], torch.Tensor]
REPLICAS = "_mimo_replicas"
"""Parameter attribute: how many ranks of its module's reduction group hold an identical copy of this
local gradient (TP-replicated x DP-replicated). The global norm counts each distinct entry once."""


class GradReducer:
    """All-reduces (SUM) a replicated module's gradients over its DP group in flat buckets.

    Every rank walks the same buckets in the same order whatever it computed: a gradient that is
    None here (the rank never ran that parameter, e.g. a text-only microbatch skipped the encoder)
    enters as zeros, so no rank waits on a collective that another skips. Each bucket also carries
    one "had a gradient" flag per parameter; a parameter no rank of the group used keeps grad None,
    exactly as in single-process training (AdamW then skips it, weight decay included).

    Construct once per module, before training: it multiplies each parameter's REPLICAS by the DP
    size, because after the reduction every DP rank holds an identical copy of the gradient. The
    bucket plan covers the parameters that require grad at construction time (`params`, in order).
    """

    def __init__(self, module: nn.Module, group: ProcessGroup, bucket_mb: float = 25.0,
                 params: Sequence[nn.Parameter] | None = None):
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}; 25 is a good default")
        self.group = group
        self.size = dist.get_world_size(group)
        self.params = [p for p in (module.parameters() if params is None else params) if p.requires_grad]
        for p in self.params:
            setattr(p, REPLICAS, getattr(p, REPLICAS, 1) * self.size)
        self.buckets = _plan_buckets(self.params, int(bucket_mb * 2**20))

    def reduce(self) -> None:
        """Sum gradients over the group; call once per step, after all microbatches' backward."""
        if self.size == 1:
            return
        flats = []
        for bucket in self.buckets:
            flat = _pack(bucket)
            flats.append((flat, dist.all_reduce(flat, group=self.group, async_op=True)))
        for bucket, (flat, work) in zip(self.buckets, flats):
            work.wait()
            _unpack(bucket, flat)


def _plan_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[list[nn.Parameter]]:
    """Split params into buckets of one dtype and device, each at most cap_bytes (or one param)."""
    buckets: list[list[nn.Parameter]] = []
    open_: dict[tuple[torch.dtype, torch.device], int] = {}
    filled: dict[tuple[torch.dtype, torch.device], int] = {}
    for p in params:
        key = (p.dtype, p.device)
        nbytes = p.numel() * p.element_size()
        if key not in open_ or filled[key] + nbytes > cap_bytes:
            open_[key], filled[key] = len(buckets), 0
            buckets.append([])
        buckets[open_[key]].append(p)
        filled[key] += nbytes
    return buckets


def _pack(bucket: list[nn.Parameter]) -> torch.Tensor:
    """Gradients (zeros where None) followed by one presence flag per parameter, in one flat tensor."""
    total = sum(p.numel() for p in bucket)
    flat = torch.zeros(total + len(bucket), dtype=bucket[0].dtype, device=bucket[0].device)
    offset = 0
    for i, p in enumerate(bucket):
        if p.grad is not None:
            flat[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
            flat[total + i] = 1
        offset += p.numel()
    return flat


def _unpack(bucket: list[nn.Parameter], flat: torch.Tensor) -> None:
    total = flat.numel() - len(bucket)
    present = (flat[total:] > 0).tolist()
    offset = 0
    for p, used in zip(bucket, present):
        chunk = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
        if not used:
            p.grad = None
        elif p.grad is None:
            p.grad = chunk
        else:
            p.grad.copy_(chunk)


FSDP_REDUCES_UNUSED_PARAMS = hasattr(FSDPModule, "set_reduce_scatter_unused_params")
"""Whether this torch's FSDP2 can reduce-scatter zeros for parameters a rank did not use. Without it
(torch 2.11, say) every rank must use the same parameters each step: true of every layout here except an
Out-path decoder that some rank has no output for, which validate_plan refuses on such a torch."""


BF16_COMPUTE = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
"""FSDP2's mixed precision under precision.master_weights: the fp32 sharded parameters are the master weights, each
unit all-gathers them in bf16 for its forward and backward, and gradients are reduce-scattered in fp32."""


def apply_fsdp(module: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool = True,
               mp_policy: MixedPrecisionPolicy | None = None,
               entry_methods: Sequence[str] = (), own_units: Sequence[str] = (),
               own_entry_methods: Sequence[str] = (),
               inner_units: Sequence[tuple[nn.Module, DeviceMesh]] = ()) -> FSDPModule:
    """Shard `module` with FSDP2 over the 1-D DP `mesh`: first each of `inner_units` over its own 1-D mesh
    (an expert-parallel LM's experts over their edp ranks, with its router and shared expert over `mesh`
    first so that the experts' unit holds the experts only), then one unit per block, one per child named
    in `own_units` (e.g. an untied LM's embedding and head: each gathered only around its lookup or product,
    forward and backward, not from the first forward to the last backward as the root's parameters are;
    those of `own_entry_methods` the child defines are registered on its unit), then the root.

    Blocks are the children of every ModuleDict/ModuleList named in BLOCK_STACKS (LM decoder layers, ViT and
    native-tower blocks).
    Gradients are reduce-scattered with a plain SUM (no 1/dp divide). Each rank holds a distinct
    shard, so parameters keep their REPLICAS (e.g. from TP) unchanged and `local_grad_sq` counts every
    shard once. Unused parameters of a unit that ran reduce-scatter zeros, keeping collectives alike.

    `entry_methods` names methods other than forward that callers invoke directly and that use
    root-level parameters; for DecoderLM pass ("embed", "logits", "head_loss") (MimoModel calls them outside the
    LM's forward). Build the
    optimizer after this call: sharding replaces the parameters.

    FSDP2 runs collectives in forward and backward, so every rank of the mesh must run every unit's
    forward and backward in every microbatch. A microbatch without a modality's input must then pass
    an empty batch (e.g. 0 images, as the colocated bridges need anyway) or run under
    `AbsentInputFiller`.
    """
    if mesh.ndim != 1:
        raise ValueError(f"apply_fsdp needs a 1-D data-parallel mesh, got {mesh.ndim}-D; pass "
                         "GridGroups.device_mesh('dp') (or ('cp', 'dp'))")
    replicas = {name: getattr(p, REPLICAS) for name, p in module.named_parameters() if hasattr(p, REPLICAS)}
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
              "mp_policy": mp_policy or MixedPrecisionPolicy()}
    containers = [m for name, m in module.named_modules()
                  if name.rsplit(".", 1)[-1] in BLOCK_STACKS and isinstance(m, (nn.ModuleDict, nn.ModuleList))]
    for unit, unit_mesh in inner_units:
        fully_shard(unit, **{**kwargs, "mesh": unit_mesh})
    for container in reversed(containers):
        for block in container.children():
            fully_shard(block, **kwargs)
    for name in own_units:
        unit = getattr(module, name, None)
        if unit is not None:
            fully_shard(unit, **kwargs)
            for method in (m for m in own_entry_methods if hasattr(unit, m)):
                register_fsdp_forward_method(unit, method)
    root = fully_shard(module, **kwargs)
    for name in entry_methods:
        register_fsdp_forward_method(root, name)
    for unit in root.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
            if FSDP_REDUCES_UNUSED_PARAMS:
                unit.set_reduce_scatter_unused_params(True, recurse=False)
    for name, p in root.named_parameters():
        if name in replicas:
            setattr(p, REPLICAS, replicas[name])
    return root


class AbsentInputFiller:
    """Keeps FSDP2-sharded modality submodules in step when a microbatch lacks their input.

    A text-only microbatch skips a modality's submodule, but under FSDP2 the other DP ranks' forward
    all-gathers and backward reduce-scatters of that submodule would then wait forever. This hooks
    the MimoModel: before its forward, every modality in `dummy_inputs` missing from the call's
    `modality_inputs` runs on its dummy input (same point in the forward as a real input, so the
    collective order matches), and the output's loss sum (hidden states when there are no labels)
    gets `0 * dummy.sum()`: exact zero gradients, the same collectives as a real input.

    A modality passed as an empty batch (0 images) runs as given: it already joins the collectives.
    `finish(groups)`, after the last backward, drops the gradients of a modality that no rank of its
    DP group ran on a non-empty input this step, so AdamW skips it as in single-process training on a
    batch without that modality.
    """

    def __init__(self, model: MimoModel, dummy_inputs: ModalityInputs):
        unknown = [m for m in dummy_inputs if m not in model.modality_submodules]
        if unknown:
            raise ValueError(f"dummy_inputs has unknown modalities {unknown}; this model has "
                             f"{list(model.modality_submodules)}")
        self.model = model
        self.dummy_inputs = dummy_inputs
        self.seen = dict.fromkeys(dummy_inputs, False)
        self._zero: torch.Tensor | None = None
        self._signature = inspect.signature(model.forward)
        self._handles = [model.register_forward_pre_hook(self._before, with_kwargs=True),
                         model.register_forward_hook(self._after)]

    def _before(self, model: nn.Module, args: tuple, kwargs: dict) -> None:
        given = self._signature.bind(*args, **kwargs).arguments.get("modality_inputs") or {}
        self._zero = None
        for name, dummy in self.dummy_inputs.items():
            if name in given:
                real = any(isinstance(t, torch.Tensor) and t.numel() > 0
                           for enc in given[name].values() for t in enc.values())
                self.seen[name] = self.seen[name] or (real and torch.is_grad_enabled())
                continue
            out = self.model.modality_submodules[name](dummy)
            zero = out.sum() * 0
            self._zero = zero if self._zero is None else self._zero + zero

    def _after(self, model: nn.Module, args: tuple, out: MimoOutput) -> MimoOutput:
        if self._zero is not None:
            if out.loss_sum is not None:
                out.loss_sum = out.loss_sum + self._zero
            else:
                out.hidden = out.hidden + self._zero.to(out.hidden.dtype)
            self._zero = None
        return out

    def finish(self, groups: dict[str, ProcessGroup]) -> None:
        """Per modality (in `dummy_inputs` order), agree over its DP group whether any rank saw a real
        input; if none did, set its gradients to None. Collective; resets for the next step."""
        for name in self.dummy_inputs:
            if name not in groups:
                raise ValueError(f"finish() needs the DP group of modality '{name}'; pass groups[{name!r}]")
            seen = torch.tensor([float(self.seen[name])], device=next(self.model.parameters()).device)
            dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=groups[name])
            if not seen.item():
                for p in self.model.modality_submodules[name].parameters():
                    p.grad = None
            self.seen[name] = False

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def norm_sq_reducer(module_names: Sequence[str], group: ProcessGroup | None = None) -> NormReducer:
    """Build MimoOptimizer's `norm_sq_reduce`: the global squared gradient norm, identical on every rank.

    `module_names` is one global order of all modules (the same list on every rank). Each rank puts
    its per-module shares (`local_grad_sq`, which already divides out replicated copies) into a
    vector with one slot per module, zero where it holds no part of (or nothing trainable in) that
    module, and one all-reduce SUM over `group` (default: the world, which must hold every rank of
    every module) adds all ranks' shares; the slots are then summed in a fixed order.

    This equals all-reducing each module over its own group and combining the results, but it is
    one collective that every rank makes identically whether the modules are colocated or live on
    disjoint ranks, and a NaN/inf share reaches every rank (a MAX reduction may drop NaN), so all
    ranks agree on skipping a step.
    """
    order = list(module_names)
    if len(set(order)) != len(order):
        raise ValueError(f"module_names {order} repeat a name; list each module once")

    def reduce(parts: dict[str, torch.Tensor]) -> torch.Tensor:
        unknown = [n for n in parts if n not in order]
        if unknown:
            raise ValueError(f"modules {unknown} have no slot in the gradient-norm reduction; add them to "
                             f"module_names (now {order})")
        device = next(iter(parts.values())).device if parts else collective_device(group)
        vec = torch.zeros(len(order), dtype=torch.float32, device=device)
        for i, name in enumerate(order):
            if name in parts:
                vec[i] = parts[name]
        dist.all_reduce(vec, group=group)
        return vec.sum()

    return reduce
