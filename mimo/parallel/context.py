"""Context parallelism (CP) for the LM: each rank of a CP group holds part of every sequence.

The combined (text + modality) sequence is cut into 2·cp equal chunks and CP rank r keeps chunks r
and 2cp−1−r, in that order (SPEC 2.6). Under causal attention a chunk's cost grows with its index, so
pairing an early chunk with its mirror gives every rank the same work. Alignment runs first on the
whole sequence (every CP rank of a data lane builds the same `[B, S, H]`), then `shard_sequence`
keeps the rank's chunks; labels, loss mask, position ids and an attention mask are cut the same way
in the data path (`shard_batch`), so RoPE, the loss and the token counts see this rank's positions.

Attention: each layer all-gathers K and V over the CP group (`gather_from_sp`: all-gather forward,
reduce-scatter of the gathered K/V's gradient backward) and runs one SDPA of the local queries against
the whole sequence, masked causally by true sequence position (exact with an unmodified SDPA, unlike
ring attention; one collective pair per layer).

Gradients: the sequence split is an `index_select`, so its backward leaves zeros at the other ranks'
positions: the LM's parameters (its embedding included) get partial gradients that the data-parallel
reduction over dp×cp sums. Modality rows must instead reach their encoders whole and identical on
every rank, so they enter the CP region through `copy_to_tp` on the CP group (identity forward,
all-reduce backward) right after their bridge.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from mimo.models.layers import DocumentRows, attention
from mimo.models.multimodal import MimoModel
from mimo.models.runtime import Crossing, ModelRuntime
from mimo.parallel.comm import copy_to_tp, gather_from_sp, gather_from_tp

SEQ_DIM = 1
"""Hidden states and per-token tensors are `[B, S, ...]`; CP shards dim 1."""

HEAD_SEQ_DIM = 2
"""q, k and v are `[B, heads, S, D]` inside attention."""

PER_TOKEN_KEYS = ("labels", "loss_mask", "position_ids")
"""Batch entries cut along the sequence like the hidden states."""



def zigzag_index(seq: int, cp: int, rank: int) -> torch.Tensor:
    """Sequence positions CP rank `rank` keeps: chunks `rank` and `2cp-1-rank` of `2cp` equal chunks."""
    chunk = seq // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return torch.cat([first, second])


def gathered_order(seq: int, cp: int) -> torch.Tensor:
    """Sequence position of each key after the all-gather: rank 0's positions, then rank 1's, ..."""
    return torch.cat([zigzag_index(seq, cp, r) for r in range(cp)])


def check_divisible(seq: int, cp: int, sp_tp: int = 1) -> None:
    """ValueError unless `seq` splits into 2·cp chunks that sequence parallel can split again over tp."""
    factor = 2 * cp * sp_tp
    if seq % factor:
        detail = f"2 x cp x tp = 2 x {cp} x {sp_tp}" if sp_tp > 1 else f"2 x cp = 2 x {cp}"
        raise ValueError(f"the LM's sequence length {seq} must be divisible by {detail} = {factor} for context "
                         f"parallel (parallel.modules.language.cp){' with sequence parallel' if sp_tp > 1 else ''}; "
                         f"pad sequences to a multiple of {factor} (data.pack_length when packing) or lower cp")


class ContextParallel:
    """One rank's context-parallel view of the LM: batch cutting, sequence sharding and attention.

    `sp_tp` is the LM's tp when sequence parallel also shards the CP-local sequence, else 1; it only
    tightens the divisibility check. Construct on every rank of the LM grid after its groups exist.
    """

    def __init__(self, group: ProcessGroup, sp_tp: int = 1):
        self.group = group
        self.cp = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.sp_tp = sp_tp
        self._positions: dict[tuple[int, torch.device | None], tuple[torch.Tensor, torch.Tensor]] = {}
        self._masks: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._orders: dict[tuple[int, torch.device], torch.Tensor] = {}

    def positions(self, seq: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Row positions of this rank's queries (zigzag) and of the all-gathered keys, made and copied to
        `device` once per sequence length (a fresh host-to-device copy every forward would wait for the GPU)."""
        key = (seq, device)
        if key not in self._positions:
            self._positions[key] = (zigzag_index(seq, self.cp, self.rank).to(device),
                                    gathered_order(seq, self.cp).to(device))
        return self._positions[key]

    def local_index(self, seq: int, device: torch.device | None = None) -> torch.Tensor:
        return self.positions(seq, device)[0]

    def shard_batch(self, batch: dict) -> dict:
        """This rank's cut of one microbatch's per-token entries (pure, no collective).

        `input_ids` (and precomputed modality indices) stay whole: alignment needs the full sequence.
        Labels, loss mask and position ids (`arange` when absent) keep this rank's positions; an
        attention mask `[..., S, S]` keeps this rank's query rows and orders its key columns as the
        all-gathered keys; packed rows' `document_ids` stay whole (the model builds this rank's `DocumentRows`
        from them, `ModelRuntime.mask_positions`). Raises ValueError on a sequence length CP cannot split.
        """
        ids = batch["input_ids"]
        seq = ids.shape[SEQ_DIM]
        check_divisible(seq, self.cp, self.sp_tp)
        out = dict(batch)
        if out.get("position_ids") is None:
            out["position_ids"] = torch.arange(seq, device=ids.device).expand_as(ids)
        index = self.local_index(seq, ids.device)
        for key in PER_TOKEN_KEYS:
            if out.get(key) is not None:
                out[key] = out[key].index_select(SEQ_DIM, index)
        mask = out.get("attention_mask")
        if mask is not None:
            if mask.shape[-2:] != (seq, seq):
                raise ValueError(f"attention_mask must end in [S, S] = [{seq}, {seq}] under context parallel, got "
                                 f"shape {tuple(mask.shape)}")
            order = self.positions(seq, ids.device)[1]
            out["attention_mask"] = mask.index_select(-2, index).index_select(-1, order)
        return out

    def shard_sequence(self, embeds: torch.Tensor) -> torch.Tensor:
        """`[B, S, H]` -> `[B, S/cp, H]`, this rank's chunks; backward scatters into zeros (no collective).

        Also makes this length's causal mask, before the LM's layers: a compiled, checkpointed layer may read
        the cache but not fill it (its recompute in backward would not replay the write)."""
        seq = embeds.shape[SEQ_DIM]
        check_divisible(seq, self.cp, self.sp_tp)
        self.causal_mask(seq, embeds.device)
        return embeds.index_select(SEQ_DIM, self.local_index(seq, embeds.device))

    def gather_sequence(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[B, S/cp, H]`, this rank's chunks -> the whole `[B, S, H]` in sequence order, on every CP rank
        (collective over the CP group); backward keeps this rank's positions of a gradient that every CP
        rank holds whole (the Out path decodes the same rows on each)."""
        seq = hidden.shape[SEQ_DIM] * self.cp
        gathered = gather_from_tp(hidden, self.group, SEQ_DIM)
        return gathered.index_select(SEQ_DIM, self.sequence_order(seq, hidden.device))

    def sequence_order(self, seq: int, device: torch.device) -> torch.Tensor:
        """Where each sequence position sits among the all-gathered positions (the inverse of
        `gathered_order`), made once per length and device."""
        key = (seq, device)
        if key not in self._orders:
            self._orders[key] = torch.argsort(gathered_order(seq, self.cp)).to(device)
        return self._orders[key]

    def causal_mask(self, seq: int, device: torch.device) -> torch.Tensor:
        """`[S/cp, S]` bool: local query at position i may see gathered key at position j <= i."""
        key = (seq, device)
        if key not in self._masks:
            q, k = self.positions(seq, device)
            self._masks[key] = k[None, :] <= q[:, None]
        return self._masks[key]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               mask: torch.Tensor | DocumentRows | None = None) -> torch.Tensor:
        """Drop-in for `layers.attention`: local queries against the CP group's gathered keys and values.

        Collective over the CP group. A given `mask` must be cut by `shard_batch` (local query rows,
        gathered key order), or be packed rows' `DocumentRows` of this rank's `positions` (FlexAttention on
        CUDA); without one, causal attention is masked by true sequence position.
        """
        seq = q.shape[HEAD_SEQ_DIM] * self.cp
        k = gather_from_sp(k, self.group, HEAD_SEQ_DIM)
        v = gather_from_sp(v, self.group, HEAD_SEQ_DIM)
        if isinstance(mask, DocumentRows):
            return mask.attend(q, k, v)
        if mask is None and causal:
            mask = self.causal_mask(seq, q.device)
        elif mask is not None and mask.shape[-2:] != (q.shape[HEAD_SEQ_DIM], seq):
            raise ValueError(f"under context parallel the attention mask must be [..., S/cp, S] = "
                             f"[..., {q.shape[HEAD_SEQ_DIM]}, {seq}] (cut by ContextParallel.shard_batch), got "
                             f"{tuple(mask.shape)}")
        return attention(q, k, v, causal=False, mask=mask)

    def enter(self, crossing: Crossing | None) -> Crossing:
        """Wrap a modality's bridge (None = identity) so its rows' gradient is summed over the CP group."""

        def cross(rows: torch.Tensor, counts: torch.Tensor, microbatch_rows: list[int] | None = None) -> torch.Tensor:
            if crossing is not None:
                rows = crossing(rows, counts, microbatch_rows)
            return copy_to_tp(rows, self.group)

        return cross

    def apply(self, model: MimoModel, runtime: ModelRuntime) -> ModelRuntime:
        """CP on a (TP-parallelized, bridged) model: `runtime` with sequence sharding before any sequence-parallel
        split (and the Out path's gather after undoing it), this rank's mask positions, CP attention in every LM
        layer and CP entry after every modality bridge. Changes nothing in place."""
        inner, inner_gather = runtime.shard_sequence, runtime.gather_sequence

        def shard(embeds: torch.Tensor) -> torch.Tensor:
            local = self.shard_sequence(embeds)
            return inner(local) if inner is not None else local

        def gather(hidden: torch.Tensor) -> torch.Tensor:
            return self.gather_sequence(inner_gather(hidden) if inner_gather is not None else hidden)

        bridges = {name: self.enter(runtime.bridges.get(name)) for name in model.modality_submodules}
        return dataclasses.replace(runtime, shard_sequence=shard, gather_sequence=gather,
                                   mask_positions=self.positions, lm_attention=self.attend, bridges=bridges)
