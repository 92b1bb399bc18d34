"""Tensor parallelism (optionally with sequence parallelism) for the decoder LM and the ViT.

Parallelism is applied from outside: every rank builds the full seeded model, then
`parallelize_lm` / `parallelize_vit` replace its linears by explicit sharded layers (`tensor_layers`) that slice the
full weights for this TP rank, so initialisation does not depend on the layout. Attention reads its
local head count from the projection shapes, so sharded q/k/v need no change to the model code.

Explicit layers, not DTensor: every communication is one call of `parallel/comm.py`, and sequence
parallelism shards the *combined* multimodal sequence through the model runtime's `shard_sequence`.

Communication per block: the input enters the TP region once (`copy_to_tp`, or with sequence parallel
`gather_from_sp`), installed as a forward pre-hook on the attention / MLP module so that q, k and v
(gate and up) share it; the row-parallel output projection leaves it (`reduce_from_tp` or
`reduce_scatter_to_sp`). Parameter names stay those of the single-device model.

Parameter attributes: `REPLICAS` (mimo.train.optim) is tp on TP-replicated parameters and 1 on
sharded ones. `TP_PARTIAL_GRAD` marks replicated parameters whose local gradient is only this rank's
part (norms and row-linear biases under sequence parallel, q/k norms always): call
`sync_sequence_parallel_grads` once after backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from mimo.models.llm import DecoderLM
from mimo.models.loss import loss_weights
from mimo.models.moe import MoEFeedForward
from mimo.models.runtime import LossFn
from mimo.models.vit import VisionTransformer
from mimo.parallel.comm import (
    copy_to_tp,
    gather_from_sp,
    gather_from_tp,
    split_to_tp,
)
from mimo.parallel.data import REPLICAS
from mimo.parallel.tensor_layers import (
    SEQ_DIM,
    TP_PARTIAL_GRAD,
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    token_dim,
    vocab_parallel_cross_entropy,
)


class _EnterTPRegion:
    """Forward pre-hook: route a block's input into the TP region once for all its column linears."""

    def __init__(self, group: ProcessGroup, sequence_parallel: bool):
        self.group = group
        self.sequence_parallel = sequence_parallel

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        x = gather_from_sp(x, self.group, token_dim(x)) if self.sequence_parallel else copy_to_tp(x, self.group)
        return (x, *args[1:])


class _SplitOutput:
    """Forward hook: keep this rank's sequence shard of a module's replicated output."""

    def __init__(self, group: ProcessGroup):
        self.group = group

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return split_to_tp(out, self.group, SEQ_DIM)


class _GatherOutput:
    """Forward hook: reassemble the full sequence from every rank's shard of a module's output."""

    def __init__(self, group: ProcessGroup):
        self.group = group

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return gather_from_tp(out, self.group, SEQ_DIM)


def _mark_partial(module: nn.Module) -> None:
    for p in module.parameters():
        setattr(p, TP_PARTIAL_GRAD, True)


def mark_tp_replicated(module: nn.Module, tp: int) -> None:
    """Set REPLICAS = tp on every parameter that has no REPLICAS yet (TP-replicated copies)."""
    for p in module.parameters():
        if not hasattr(p, REPLICAS):
            setattr(p, REPLICAS, tp)


def _parallelize_block(attn: nn.Module, mlp: nn.Module | None, columns: tuple[str, ...], rows: tuple[str, ...],
                       group: ProcessGroup, sequence_parallel: bool) -> None:
    """Shard one transformer block's attention (q/k/v -> o) and MLP (`columns` -> `rows`; None: attention only)."""
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(attn, name, ColumnParallelLinear(getattr(attn, name), group))
    attn.o_proj = RowParallelLinear(attn.o_proj, group, sequence_parallel)
    for name in columns if mlp is not None else ():
        setattr(mlp, name, ColumnParallelLinear(getattr(mlp, name), group))
    for name in rows if mlp is not None else ():
        setattr(mlp, name, RowParallelLinear(getattr(mlp, name), group, sequence_parallel))
    for block in (attn, mlp) if mlp is not None else (attn,):
        block.register_forward_pre_hook(_EnterTPRegion(group, sequence_parallel))
    for norm in (attn.q_norm, attn.k_norm):
        if norm is not None:
            _mark_partial(norm)


def parallelize_lm(lm: DecoderLM, tp_group: ProcessGroup, sequence_parallel: bool) -> None:
    """Shard `lm` in place over `tp_group`: q/k/v/gate/up column-parallel, o/down row-parallel, the
    embedding (and an untied head) split by vocabulary. Not collective. A mixture-of-experts MLP is not split:
    its router and experts run TP-replicated on the replicated input (expert parallelism splits the experts).

    With sequence parallel the LM runs on this rank's sequence shard: give the model a runtime
    (mimo.models.runtime) whose `shard_sequence` is `sequence_shard(tp_group)`; either way its `loss_fn` is
    `tp_lm_loss(...)` and its `logits_fn` `tp_lm_logits(...)`. The sizes divide by tp (the gate checked them).
    """
    cfg, tp = lm.cfg, dist.get_world_size(tp_group)
    assert not (cfg.heads % tp or cfg.kv_heads % tp or cfg.vocab % tp or cfg.mlp % tp), "the gate's validate_plan"
    if lm.embed_tokens is not None:
        lm.embed_tokens = VocabParallelEmbedding(lm.embed_tokens, tp_group)
    if lm.lm_head is not None:
        lm.lm_head = ColumnParallelLinear(lm.lm_head, tp_group)
    for layer in lm.layers.values():
        mlp = None if isinstance(layer.mlp, MoEFeedForward) else layer.mlp
        _parallelize_block(layer.self_attn, mlp, ("gate_proj", "up_proj"), ("down_proj",), tp_group, sequence_parallel)
        if sequence_parallel and mlp is None:  # each TP rank routes its own sequence shard
            _mark_partial(layer.mlp)
        if sequence_parallel:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                         layer.post_feedforward_layernorm):
                if norm is not None:  # OLMo 2 has no input norm, OLMo 2 and Gemma feed-forward ones
                    _mark_partial(norm)
    if sequence_parallel and lm.norm is not None:
        _mark_partial(lm.norm)
    mark_tp_replicated(lm, tp)


def set_lm_sequence_parallel(lm: DecoderLM, on: bool) -> None:
    """Switch an LM laid out by `parallelize_lm(..., sequence_parallel=True)` between its sequence shard (on, as
    built) and the whole sequence on every TP rank (off: block inputs copied into the TP region, row-parallel
    outputs all-reduced, as plain TP), e.g. for greedy decoding's one-token steps. Not collective."""
    for module in lm.modules():
        if isinstance(module, RowParallelLinear):
            module.sequence_parallel = on
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, _EnterTPRegion):
                hook.sequence_parallel = on


def parallelize_vit(vit: VisionTransformer, tp_group: ProcessGroup, sequence_parallel: bool) -> None:
    """Shard `vit` in place over `tp_group` (q/k/v/fc1 column-parallel, o/fc2 row-parallel). Not collective.

    With sequence parallel the token sequence (patches and class token) is split after the pre-LN and
    gathered after the last block (before a post-LN), so the output stays full and TP-replicated. Heads, MLP
    and (with sequence parallel) tokens divide by tp (the gate checked them).
    """
    cfg, tp = vit.cfg, dist.get_world_size(tp_group)
    tokens = vit.position_embedding.num_embeddings
    assert not (cfg.heads % tp or cfg.mlp % tp or sequence_parallel and tokens % tp), "the gate's check_layout"
    for block in vit.layers.values():
        _parallelize_block(block.self_attn, block.mlp, ("fc1",), ("fc2",), tp_group, sequence_parallel)
        if sequence_parallel:
            _mark_partial(block.layer_norm1)
            _mark_partial(block.layer_norm2)
    if sequence_parallel and len(vit.layers):
        vit.pre_layrnorm.register_forward_hook(_SplitOutput(tp_group))
        list(vit.layers.values())[-1].register_forward_hook(_GatherOutput(tp_group))
    mark_tp_replicated(vit, tp)


def sequence_shard(tp_group: ProcessGroup) -> Callable[[torch.Tensor], torch.Tensor]:
    """For `ModelRuntime.shard_sequence`: keep this TP rank's contiguous chunk of the combined `[B, S, H]`
    sequence (backward all-gathers). Collective in backward."""
    tp = dist.get_world_size(tp_group)

    def shard(embeds: torch.Tensor) -> torch.Tensor:
        s = embeds.shape[SEQ_DIM]
        if s % tp:
            raise ValueError(f"sequence length S={s} must be divisible by tp={tp} for sequence parallel; pad "
                             f"the batch to a multiple of {tp} tokens or turn sequence_parallel off")
        return split_to_tp(embeds, tp_group, SEQ_DIM)

    return shard


def sequence_gather(tp_group: ProcessGroup) -> Callable[[torch.Tensor], torch.Tensor]:
    """For `ModelRuntime.gather_sequence`: the TP group's contiguous chunks of `[B, S/tp, H]` -> the whole
    `[B, S, H]` on every TP rank (all-gather); backward keeps this rank's chunk of the gradient, which
    every TP rank holds whole (the Out path decodes the same rows on each). Collective in forward."""

    def gather(hidden: torch.Tensor) -> torch.Tensor:
        return gather_from_tp(hidden, tp_group, SEQ_DIM)

    return gather


def enter_head(hidden: torch.Tensor, group: ProcessGroup, sequence_parallel: bool) -> torch.Tensor:
    """Collective. The LM head is column-parallel over the vocabulary: its input enters the TP region
    full-length (gathered from sequence-parallel shards), and its gradient leaves summed over the group."""
    return gather_from_sp(hidden, group, token_dim(hidden)) if sequence_parallel else copy_to_tp(hidden, group)


def sequence_parallel_rows(mb: dict, tp: int, rank: int) -> dict:
    """A microbatch whose `loss_rows` (labelled flat positions of `[B, S]`, `with_loss_rows`) become those of
    every TP rank's sequence shard (rank r: positions r*S/tp..(r+1)*S/tp-1 of each row), each padded with
    unlabelled positions of its shard to the group's largest count M: `shard_loss_rows` `[M]` index this rank's
    own `[B, S/tp]` positions, `loss_rows` `[tp * M]` the TP group's gathered `[B, S]` ones, rank 0's first (the
    order in which the row-parallel collectives split and gather them). Pure, host; the same on every TP rank."""
    labels = mb["labels"]
    b, s = labels.shape
    if s % tp:
        return mb  # sequence_shard refuses this length before any row is used
    shard = s // tp
    labelled = torch.zeros(b * s, dtype=torch.bool)
    labelled[mb["loss_rows"].cpu()] = True
    per_rank = labelled.view(b, tp, shard).transpose(0, 1).reshape(tp, b * shard)
    width = max(1, int(per_rank.sum(1).max()))
    # Labelled positions first, then unlabelled ones (zero loss weight, zero gradient) up to `width`.
    local = torch.sort(torch.argsort((~per_rank).to(torch.int8), dim=1, stable=True)[:, :width], dim=1).values
    gathered = (local // shard) * s + torch.arange(tp)[:, None] * shard + local % shard
    device = mb["loss_rows"].device
    return {**mb, "loss_rows": gathered.reshape(-1).to(device), "shard_loss_rows": local[rank].to(device)}


def tp_lm_loss(tp_group: ProcessGroup, sequence_parallel: bool) -> LossFn:
    """For `ModelRuntime.loss_fn`: (loss sum, token count) through the vocab-parallel head and cross
    entropy, never gathering full logits. Collective; both results are replicated over the TP group."""

    def loss(hidden: torch.Tensor, lm: DecoderLM, labels: torch.Tensor,
             loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        logits = lm.logits(enter_head(hidden, tp_group, sequence_parallel))
        per_token = vocab_parallel_cross_entropy(logits, labels, tp_group)
        w = loss_weights(labels, loss_mask)
        return (per_token * w).sum(), w.sum()

    return loss


def tp_lm_logits(tp_group: ProcessGroup,
                 sequence_parallel: bool) -> Callable[[torch.Tensor, DecoderLM], torch.Tensor]:
    """For `ModelRuntime.logits_fn`: full `[B, S, V]` logits on every TP rank (inference). Collective."""

    def logits(hidden: torch.Tensor, lm: DecoderLM) -> torch.Tensor:
        local = lm.logits(enter_head(hidden, tp_group, sequence_parallel))
        return gather_from_tp(local, tp_group, -1)

    return logits


def sync_sequence_parallel_grads(module: nn.Module, tp_group: ProcessGroup) -> None:
    """Collective. Sum over `tp_group` the gradients of parameters marked TP_PARTIAL_GRAD, so every
    TP rank holds the full gradient. Call once per step after the last backward, before the DP
    reduction and the optimizer; a no-op where nothing is marked (TP without sequence parallel and
    without q/k norms) or tp = 1."""
    if dist.get_world_size(tp_group) == 1:
        return
    buckets: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in module.parameters():
        if getattr(p, TP_PARTIAL_GRAD, False) and p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            buckets.setdefault(g.dtype, []).append(g)
    for grads in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=tp_group)
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))


def tp_shard_dim(owner: nn.Module, pname: str) -> int | None:
    """The dim along which tensor parallelism split this parameter, or None if it is TP-replicated."""
    if isinstance(owner, (ColumnParallelLinear, VocabParallelEmbedding)):
        return 0
    if isinstance(owner, RowParallelLinear) and pname.endswith("weight"):
        return 1
    return None
