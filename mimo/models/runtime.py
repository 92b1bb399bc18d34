"""ModelRuntime: everything a layout or a fast path changes about how a `MimoModel` computes, in one object.

The model's parameters and modules are its own; how its forward crosses between module layouts, splits the
sequence, takes its loss and runs a modality in its own precision is this object's. The defaults are one
process: no crossing, the whole sequence, the LM's own head and loss. A model is given its runtime once, by
`MimoModel.set_runtime` (mimo.parallel.plan's `ParallelPlan.parallelize`, on every layout and on one process);
generation in the training layout swaps it for a derived one (`MimoModel.running`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from mimo.models.llm import DecoderLM
from mimo.models.loss import cross_entropy_sum

Crossing = Callable[..., torch.Tensor]
"""A bridge: `(rows, counts, microbatch_rows=None) -> rows` (see `ModelRuntime.bridges`)."""

LossFn = Callable[[torch.Tensor, DecoderLM, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]
"""`(hidden, lm, labels, loss_mask) -> (loss sum, token count)`."""


class ModuleClock(Protocol):
    """Stamps a module's forward and backward (mimo.train.module_time): `start(name)` right before module `name`
    computes gives a token (None: not timing this call), `end(name, out, token)` right after gives its output
    `out` back, tied to the token in the autograd graph so that backward stamps where the module's backward
    begins and ends."""

    def start(self, name: str) -> torch.Tensor | None: ...

    def end(self, name: str, out: torch.Tensor, token: torch.Tensor | None) -> torch.Tensor: ...


def lm_loss(hidden: torch.Tensor, lm: DecoderLM, labels: torch.Tensor,
            loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One process's loss: the LM's logits and a summed cross entropy."""
    return cross_entropy_sum(lm.logits(hidden), labels, loss_mask)


def lm_logits(hidden: torch.Tensor, lm: DecoderLM) -> torch.Tensor:
    """One process's logits: the LM's head."""
    return lm.logits(hidden)


@dataclass(frozen=True)
class ModelRuntime:
    """How a `MimoModel` computes on this rank. Frozen: derive another with `dataclasses.replace`.

    - `bridges[m](rows, counts, microbatch_rows)`: modality m's encoder rows -> this LM replica's; `counts` `[B]`
      its rows per sample, `microbatch_rows` (or None) the host list of every sample's rows in the whole
      microbatch (all data lanes), which spares a bridge exchanging counts. Absent: the rows as they are.
    - `output_bridges[m]` = (to the modality's layout, back to the LM's), the same contract, around the Out path's
      decoder.
    - `shard_sequence`: the LM's `[B, S, H]` input -> this rank's positions (sequence or context parallel).
    - `gather_sequence`: its undoing for the Out path: this rank's `[B, S_local, H]` LM states -> the whole
      `[B, S, H]` (identical on the ranks that shared the sequence), gradient back to this rank's positions.
    - `mask_positions(length, device)`: row positions of the queries this rank's attention runs and of the keys
      it sees, for masks built from per-token values (context parallel); None: the whole row in order.
    - `lm_attention`: the attention kernel of every LM layer (`mimo.models.layers.attention`'s contract; context
      parallel's); None: each layer's own.
    - `loss_fn`, `logits_fn`: the LM's loss (`LossFn`) and logits `(hidden, lm) -> [.., V]`.
    - `modality_autocast[m]` = (device type, bf16): modality m's encoders, projections and decoders run in an
      autocast context of their own (mimo.train.precision); absent: the caller's.
    - `module_clock`: times each modality's encoders and projections and the LM (from its input embeddings to its
      loss), forward and backward (`ModuleClock`); None: no stamps.
    """

    bridges: Mapping[str, Crossing] = field(default_factory=dict)
    output_bridges: Mapping[str, tuple[Crossing, Crossing]] = field(default_factory=dict)
    shard_sequence: Callable[[torch.Tensor], torch.Tensor] | None = None
    gather_sequence: Callable[[torch.Tensor], torch.Tensor] | None = None
    mask_positions: Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]] | None = None
    lm_attention: Callable[..., torch.Tensor] | None = None
    loss_fn: LossFn = lm_loss
    logits_fn: Callable[[torch.Tensor, DecoderLM], torch.Tensor] = lm_logits
    modality_autocast: Mapping[str, tuple[str, bool]] = field(default_factory=dict)
    module_clock: ModuleClock | None = None
