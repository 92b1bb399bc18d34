"""One product for each attention's q, k and v (`SelfAttention.fuse_qkv`).

Three products of the same input leave the GPU partly idle on the narrow ones (k and v under grouped-query
attention) and make the norm's backward read and sum three input gradients. Concatenating the three weights
at each call (a few MB) gives one wider product each way; the parameters, their names and checkpoints stay
those of three linears, and each weight's gradient is a slice of the concatenated one.

Under tensor parallelism each rank concatenates its own shards: q, k and v are column-parallel
(`ColumnParallelLinear`, local heads), do no communication of their own (their input enters the TP region
once, before the attention), so one product over the three local shards is what the three compute.
"""

from __future__ import annotations

from torch import nn

from mimo.models.layers import SelfAttention
from mimo.parallel.tensor_layers import ColumnParallelLinear

FUSABLE = (nn.Linear, ColumnParallelLinear)
"""Projections whose forward is exactly `F.linear(x, weight, bias)`."""


def fuse_qkv(model: nn.Module) -> int:
    """Turn the fused projection on in every attention of `model` that this rank holds; how many. Refused
    (ValueError) where a projection is neither a plain `nn.Linear` nor a column-parallel shard of one
    (adapted: its own forward must run) or where the three differ in dtype. A projection without a bias
    beside ones with one (Whisper's key) fuses with zeros for it."""
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, SelfAttention):
            continue
        linears = (module.q_proj, module.k_proj, module.v_proj)
        if any(type(lin) not in FUSABLE for lin in linears):
            raise ValueError(f"fuse_qkv: {name}'s q/k/v projections are neither plain nn.Linear nor column-parallel "
                             f"shards of one (adapted?): leave fuse_qkv off")
        if any(lin.weight is None for lin in linears):  # released: the module runs on other ranks (pipeline)
            continue
        if len({lin.weight.dtype for lin in linears}) != 1:
            raise ValueError(f"fuse_qkv: {name}'s q/k/v projections differ in dtype; leave fuse_qkv off")
        module.fuse_qkv()
        count += 1
    return count
