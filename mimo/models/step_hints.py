"""StepHints: what a training step or a layout knows about a batch besides its tokens, labels and masks, given to
`MimoModel.forward` in one object. Every field is optional; `forward_args` turns a microbatch dict (as
mimo.data.batching and mimo.parallel.plan make them) into forward's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class StepHints:
    """Optional facts about one (micro)batch for `MimoModel.forward`.

    - `modality_targets` `{modality: [B, K, D]}`: the Out path's targets, sample-aligned (see
      `MimoModel.output_losses`); forward then also returns each modality's decoder loss sum and token count.
    - `document_ids` `[B, S]`: packed rows (mimo.data.packing); forward builds the block-diagonal causal mask from
      them on their device, in place of an `attention_mask`.
    - `modality_token_indices` `{name: [n]}` (and "text"): flat placeholder positions, row-major over `[B, S]`,
      precomputed with the batch (`token_indices`), so alignment needs no device reduction.
    - `loss_rows` `[N]` (with labels): the flat positions that carry a label; the LM's last layer after attention,
      its final norm and the loss run on those rows only (`hidden` is then `[N, H]`); the loss is the same.
    - `shard_loss_rows`: under sequence parallelism, this rank's part of `loss_rows` (`DecoderLM.forward(shard_rows=)`).
    - `microbatch_rows` `{modality or out_key(modality): [rows per sample]}`: host ints over the whole microbatch of
      every data lane, the bridges' counts without an exchange (mimo.parallel.plan adds them). The result does not
      depend on them.
    """

    modality_targets: dict[str, torch.Tensor] | None = None
    document_ids: torch.Tensor | None = None
    modality_token_indices: dict[str, torch.Tensor] | None = None
    loss_rows: torch.Tensor | None = None
    shard_loss_rows: torch.Tensor | None = None
    microbatch_rows: dict[str, list[int]] | None = None


HINT_KEYS = frozenset(f.name for f in fields(StepHints))
"""The microbatch keys that travel in `StepHints`."""


def forward_args(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A microbatch dict as `MimoModel.forward`'s keyword arguments: its `HINT_KEYS` gathered into `hints`, the rest
    (input_ids, labels, loss_mask, modality_inputs, position_ids, attention_mask) as they are. Pure."""
    out = {k: v for k, v in batch.items() if k not in HINT_KEYS}
    hints = {k: v for k, v in batch.items() if k in HINT_KEYS and v is not None}
    if hints:
        out["hints"] = StepHints(**hints)
    return out
