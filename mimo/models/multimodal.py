"""MimoModel: the multimodal seam. Modality submodules turn raw inputs into LM-width rows, the rows
are placed at their placeholder tokens, and the LM runs over the combined sequence.

Where encoder output crosses to the LM: `MimoModel.embed_modalities` runs each submodule and passes
its rows through its bridge in `self.runtime` (mimo.models.runtime: identity on one process; a layout's
`ParallelPlan.parallelize` gives the model the real crossings), then `align_embeddings` writes them into the
sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from mimo.config.schema import LANGUAGE
from mimo.models.layers import DocumentRows, padding_causal_mask
from mimo.models.llm import DecoderLM
from mimo.models.runtime import ModelRuntime
from mimo.models.sample_rows import leading_rows, run_encoder
from mimo.models.step_hints import StepHints

BLOCK_STACKS = ("layers", "blocks")
"""The attributes a model keeps its `nn.ModuleDict` of transformer blocks in: `layers` (the LM, ViT, audio and the
other towers), `blocks` (the native-resolution tower, named as transformers' Qwen-VL so weights map one to one).
Where FSDP cuts its units (mimo.parallel.data) and the fast paths find blocks (mimo.perf.apply)."""

TEXT = "text"


def out_key(name: str) -> str:
    """`microbatch_rows`' key of modality `name`'s Out path (its generation tokens per sample)."""
    return f"{name}:out"


class ModalitySubmodules(nn.Module):
    """Encoders (named, run in registration order), input projections, output projections, decoders.

    Subclass or instantiate directly with your own modules to plug in a new modality.
    """

    def __init__(self, encoders: dict[str, nn.Module] | None = None,
                 input_projections: list[nn.Module] | None = None,
                 output_projections: list[nn.Module] | None = None,
                 decoders: dict[str, nn.Module] | None = None):
        super().__init__()
        self.encoders = nn.ModuleDict(encoders or {})
        self.input_projections = nn.ModuleList(input_projections or [])
        self.output_projections = nn.ModuleList(output_projections or [])
        self.decoders = nn.ModuleDict(decoders or {})
        self.autocast: tuple[str, bool] | None = None  # (device type, bf16) from `ModelRuntime.modality_autocast`

    def own_precision(self) -> contextlib.AbstractContextManager:
        """The autocast context this modality's encoders, projections and decoders run in: its own where the
        runtime gives it one (`MimoModel.set_runtime`), else the caller's."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.autocast[0], dtype=torch.bfloat16, enabled=self.autocast[1])

    def encode(self, encoder_inputs: dict[str, dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Run every encoder on its keyword inputs; each output flattened to rows `[n, h]`."""
        rows = []
        for name, encoder in self.encoders.items():
            if name not in encoder_inputs:
                raise ValueError(f"no inputs for encoder '{name}'; modality_inputs[modality] must have keys "
                                 f"{list(self.encoders)}, got {list(encoder_inputs)}")
            with self.own_precision():
                out = run_encoder(encoder, encoder_inputs[name], name)
            if out.dim() == 3:
                out = out.reshape(-1, out.shape[-1])
            elif out.dim() != 2:
                raise ValueError(f"encoder '{name}' returned a {out.dim()}-D tensor; expected [b, s, h] or "
                                 "[b*s, h]")
            rows.append(out)
        return rows

    @staticmethod
    def combine(rows: list[torch.Tensor]) -> torch.Tensor:
        if not rows:
            raise ValueError("cannot combine an empty list of embeddings")
        return rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        with self.own_precision():
            for proj in self.input_projections:
                rows = proj(rows)
        return rows

    def forward(self, encoder_inputs: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        return self.project(self.combine(self.encode(encoder_inputs)))

    def encode_project(self, name: str, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder `name` alone on its keyword `inputs` (`run_encoder`: 0 inputs run a zero stand-in and give 0
        rows): (its output as returned, `[n, s, h]` or `[rows, h]`; those rows `[rows, H]` through the input
        projections). One call through this module's own parameters, so a wrapper that registers it as a
        forward (FSDP2's entry methods, as the pipeline's encoder stage needs) gathers them around it."""
        with self.own_precision():
            out = run_encoder(self.encoders[name], inputs, name)
        return out, self.project(out.reshape(-1, out.shape[-1]))

    def decode(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """The Out path: LM hidden rows -> output projections -> decoders (in registration order)."""
        if not self.output_projections and not self.decoders:
            raise ValueError("this modality has no output projection or decoder; it cannot decode")
        x = hidden_rows
        with self.own_precision():
            for proj in self.output_projections:
                x = proj(x)
            for dec in self.decoders.values():
                x = dec(x)
        return x

    def output_loss(self, pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss sum, output-token count) of decoded rows against target rows: the last decoder's `loss`."""
        last = list(self.decoders.values())[-1] if self.decoders else None
        if not hasattr(last, "loss"):
            raise ValueError("this modality's last decoder has no loss(pred, target) -> (sum, count) method; "
                             "give it one to train the Out path")
        return last.loss(pred, target)


def _check_counts(name: str, k: int, n: int) -> None:
    if k != n:
        raise ValueError(f"Number of {name} tokens ({k}) does not match number of {name} embeddings ({n})")


def align_embeddings(text_rows: torch.Tensor, modality_rows: dict[str, torch.Tensor], input_ids: torch.Tensor,
                     token_ids: dict[str, int]) -> torch.Tensor:
    """Mask path: text rows fill non-placeholder positions, each modality's rows fill its placeholders,
    both in batch-major order. Returns `[B, S, H]`."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, S], got shape {tuple(input_ids.shape)}")
    b, s = input_ids.shape
    out = text_rows.new_zeros(b, s, text_rows.shape[-1])
    text_mask = text_positions(input_ids, token_ids)
    _check_counts(TEXT, int(text_mask.sum()), text_rows.shape[0])
    out = out.masked_scatter(text_mask[..., None], text_rows)
    for name, rows in modality_rows.items():
        if name not in token_ids:
            raise ValueError(f"No special token ID defined for modality {name}; set "
                             f"model.modalities.{name}.token_id")
        mask = input_ids == token_ids[name]
        _check_counts(name, int(mask.sum()), rows.shape[0])
        out = out.masked_scatter(mask[..., None], rows.to(out.dtype))
    return out


def align_embeddings_by_index(text_rows: torch.Tensor, modality_rows: dict[str, torch.Tensor],
                              indices: dict[str, torch.Tensor], batch: int, seq: int) -> torch.Tensor:
    """Index path: precomputed flat positions (row-major over `[B, S]`) per modality and for "text".

    Shapes and coverage are validated; index values are trusted (no device reduction, no host sync).
    """
    rows = {TEXT: text_rows, **modality_rows}
    if set(indices) != set(rows):
        raise ValueError(f"precomputed token indices must have the same modalities as the embeddings: got "
                         f"{sorted(indices)}, expected {sorted(rows)}")
    total = 0
    for name, idx in indices.items():
        if idx.dim() != 1:
            raise ValueError(f"{name} token indices must be one-dimensional, got shape {tuple(idx.shape)}")
        if idx.numel() != rows[name].shape[0]:
            raise ValueError(f"Number of {name} token indices ({idx.numel()}) does not match number of "
                             f"{name} embeddings ({rows[name].shape[0]})")
        total += idx.numel()
    if total != batch * seq:
        raise ValueError(f"precomputed token indices must cover B*S = {batch * seq} positions, got {total}")
    out = text_rows.new_zeros(batch * seq, text_rows.shape[-1])
    for name, r in rows.items():
        out = out.index_copy(0, indices[name], r.to(out.dtype))
    return out.view(batch, seq, -1)


def text_positions(input_ids: torch.Tensor, token_ids: dict[str, int]) -> torch.Tensor:
    """Boolean mask of positions holding ordinary text tokens."""
    if not token_ids:
        return torch.ones_like(input_ids, dtype=torch.bool)
    ids = torch.tensor(sorted(token_ids.values()), device=input_ids.device, dtype=input_ids.dtype)
    return ~torch.isin(input_ids, ids)


def token_indices(input_ids: torch.Tensor, token_ids: dict[str, int]) -> dict[str, torch.Tensor]:
    """Flat row-major positions for "text" and each modality: what a data pipeline precomputes."""
    flat = input_ids.reshape(-1)
    out = {TEXT: text_positions(input_ids, token_ids).reshape(-1).nonzero().squeeze(1)}
    for name, tid in token_ids.items():
        out[name] = (flat == tid).nonzero().squeeze(1)
    return out


@dataclass
class MimoOutput:
    """What a forward returns: hidden states always; loss sum and token count when labels are given,
    else logits."""

    hidden: torch.Tensor
    loss_sum: torch.Tensor | None = None
    num_tokens: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    # The Out path, per modality given `modality_targets`: decoder loss sum and output-token count.
    modality_loss_sums: dict[str, torch.Tensor] = field(default_factory=dict)
    modality_num_tokens: dict[str, torch.Tensor] = field(default_factory=dict)


class MimoModel(nn.Module):
    """An LM plus modality submodules keyed by modality name (`images`, `audio`, ...)."""

    def __init__(self, language_model: DecoderLM, modalities: dict[str, ModalitySubmodules],
                 special_token_ids: dict[str, int], output_token_ids: dict[str, int] | None = None):
        super().__init__()
        missing = [m for m in modalities if m not in special_token_ids]
        if missing:
            raise ValueError(f"modalities {missing} have no placeholder token id; pass special_token_ids "
                             f"for every modality (model.modalities.<name>.token_id)")
        self.language_model = language_model
        self.modality_submodules = nn.ModuleDict(modalities)
        self.special_token_ids = dict(special_token_ids)
        # The Out path: generation token id per modality whose decoder turns LM states into its output.
        self.output_token_ids = dict(output_token_ids or {})
        no_decoder = [m for m in self.output_token_ids if m not in modalities or not modalities[m].decoders]
        if no_decoder:
            raise ValueError(f"output_token_ids names {no_decoder}, which have no decoder; give those modality "
                             "submodules decoders (and output projections)")
        self.runtime = ModelRuntime()

    def set_runtime(self, runtime: ModelRuntime) -> ModelRuntime:
        """Give the model how it computes on this rank (mimo.models.runtime); returns the one it had. The one
        entry point for a layout's crossings, sequence split, loss and per-modality precision. Not collective."""
        previous, self.runtime = self.runtime, runtime
        self.language_model.use_attention(runtime.lm_attention)
        for name, sub in self.modality_submodules.items():
            sub.autocast = runtime.modality_autocast.get(name)
        return previous

    @contextlib.contextmanager
    def running(self, runtime: ModelRuntime) -> Iterator[None]:
        """Inside the block the model computes with `runtime`; the one it had is given back on exit."""
        previous = self.set_runtime(runtime)
        try:
            yield
        finally:
            self.set_runtime(previous)

    def embed_modalities(self, input_ids: torch.Tensor,
                         modality_inputs: dict[str, dict[str, dict[str, torch.Tensor]]] | None,
                         microbatch_rows: dict[str, list[int]] | None = None) -> dict[str, torch.Tensor]:
        """Run each modality present in `modality_inputs`, cross its bridge; returns rows per modality. A bridge
        is a collective: every rank's batch has (maybe empty) inputs of a modality or none, alike (as
        mimo.data.batching's splits of one global batch do)."""
        modality_inputs = modality_inputs or {}
        unknown = [m for m in modality_inputs if m not in self.modality_submodules]
        if unknown:
            raise ValueError(f"modality_inputs has unknown modalities {unknown}; this model has "
                             f"{list(self.modality_submodules)}")
        rows = {}
        for name, sub in self.modality_submodules.items():
            inputs = modality_inputs.get(name)
            bridge = self.runtime.bridges.get(name)
            if inputs is None:
                continue
            r = self.timed(name, sub, inputs)
            if bridge is not None:
                r = bridge(r, (input_ids == self.special_token_ids[name]).sum(1), (microbatch_rows or {}).get(name))
            rows[name] = r
        return rows

    def timed(self, name: str, sub: ModalitySubmodules, inputs: dict) -> torch.Tensor:
        """Modality `name`'s rows, its encoders and projections stamped by the runtime's `module_clock` if any."""
        clock = self.runtime.module_clock
        token = clock.start(name) if clock is not None else None
        rows = sub(inputs)
        return rows if token is None else clock.end(name, rows, token)

    def unfed_parameters(self, fed: Collection[str]) -> list[nn.Parameter]:
        """What a training step whose global batch feeds only the modalities `fed` (`fed_modalities`) does not train:
        every other modality's encoders and input projections. One process leaves their gradients None (zero only
        from `run_encoder`'s stand-in on 0 inputs); a layout's collectives leave zeros (FSDP2 reduce-scatters a
        unit's unused parameters, a stand-in runs on a lane without inputs). The trainer sets their gradients to
        None before the update, so that no layout's optimizer moves them (AdamW's weight decay included)."""
        return [p for name, sub in self.modality_submodules.items() if name not in fed
                for part in (sub.encoders, sub.input_projections) for p in part.parameters()]

    def check_inputs_present(self, input_ids: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        for name, tid in self.special_token_ids.items():
            if name not in rows:
                n = int((input_ids == tid).sum())
                if n:
                    raise ValueError(f"input_ids hold {n} placeholder tokens of '{name}' (id {tid}) but "
                                     f"modality_inputs has no '{name}' entry")

    def combined_embeddings(self, input_ids: torch.Tensor,
                            modality_inputs: dict | None = None,
                            modality_token_indices: dict[str, torch.Tensor] | None = None,
                            microbatch_rows: dict[str, list[int]] | None = None) -> torch.Tensor:
        """The LM's input sequence `[B, S, H]`: text embeddings with modality rows at placeholders."""
        rows = self.embed_modalities(input_ids, modality_inputs, microbatch_rows)
        lm = self.language_model
        if modality_token_indices is not None:
            text_ids = input_ids.reshape(-1).index_select(0, modality_token_indices[TEXT])
            return align_embeddings_by_index(lm.embed(text_ids), rows, modality_token_indices, *input_ids.shape)
        self.check_inputs_present(input_ids, rows)
        return self.embed_with_rows(input_ids, rows)

    def embed_with_rows(self, input_ids: torch.Tensor, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        """Text embeddings with each modality's encoder rows `[N, H]` written at its placeholders; rows
        may come from this process's encoders or, pipelined, over the bridge."""
        text_ids = input_ids[text_positions(input_ids, self.special_token_ids)]
        return align_embeddings(self.language_model.embed(text_ids), rows, input_ids, self.special_token_ids)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                modality_inputs: dict | None = None, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None,
                hints: StepHints | None = None) -> MimoOutput:
        """Embed, align, run the LM. With labels: per-token loss sum and token count (not a mean), else logits.

        `attention_mask`: a bool `[B, 1, S, S]` (True = may attend) or transformers' `[B, S]` 0/1 padding mask,
        made causal here; `position_ids` default to 0..S-1 either way (pass them for left-padded rows). `hints`:
        what the step or the layout knows about the batch (mimo.models.step_hints)."""
        hints = hints or StepHints()
        attention_mask = self.attention_mask(input_ids, attention_mask, hints.document_ids)
        embeds = self.combined_embeddings(input_ids, modality_inputs, hints.modality_token_indices,
                                          hints.microbatch_rows)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        clock = self.runtime.module_clock
        token = clock.start(LANGUAGE) if clock is not None and labels is not None else None
        if self.runtime.shard_sequence is not None:
            embeds = self.runtime.shard_sequence(embeds)
        loss_rows = hints.loss_rows
        hidden = self.language_model(embeds, position_ids, mask=attention_mask, output_rows=loss_rows,
                                      shard_rows=hints.shard_loss_rows)
        if loss_rows is not None:
            labels = labels.reshape(-1).index_select(0, loss_rows)
            loss_mask = None if loss_mask is None else loss_mask.reshape(-1).index_select(0, loss_rows)
        if labels is None:
            out = MimoOutput(hidden=hidden, logits=self.runtime.logits_fn(hidden, self.language_model))
        else:
            loss_sum, num_tokens = self.runtime.loss_fn(hidden, self.language_model, labels, loss_mask)
            loss_sum = loss_sum if token is None else clock.end(LANGUAGE, loss_sum, token)
            out = MimoOutput(hidden=hidden, loss_sum=loss_sum, num_tokens=num_tokens)
        if hints.modality_targets:
            out.modality_loss_sums, out.modality_num_tokens = self.output_losses(
                hidden, input_ids, hints.modality_targets, hints.microbatch_rows)
        return out

    def attention_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       document_ids: torch.Tensor | None) -> torch.Tensor | DocumentRows | None:
        """The LM's mask for this rank's rows (`row_positions`): block-diagonal causal from packed rows'
        `document_ids` `[B, S]` on their device (`DocumentRows`: block-sparse on CUDA),
        causal over a `[B, S]` padding mask, or a given `[B, 1, S, S]` mask as it is."""
        if document_ids is not None:
            if attention_mask is not None:
                raise ValueError("pass attention_mask or document_ids, not both: document_ids builds the mask")
            return self.document_attention(document_ids)
        if attention_mask is not None and attention_mask.dim() == 2:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"a [B, S] attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            queries, keys = self.row_positions(input_ids.shape[1], attention_mask.device)
            return padding_causal_mask(attention_mask.index_select(1, keys), queries, keys)
        return attention_mask

    def document_attention(self, document_ids: torch.Tensor) -> DocumentRows:
        """The LM's mask for this rank's queries over packed rows' whole `document_ids` `[B, S]`: `DocumentRows`
        (block-sparse on CUDA) of the whole rows, or under context parallel of this rank's `row_positions`. Also
        what every pipeline stage builds from the ids that travel with its microbatch."""
        if self.runtime.mask_positions is None:
            return DocumentRows.of(document_ids)
        return DocumentRows.of(document_ids, *self.row_positions(document_ids.shape[1], document_ids.device))

    def row_positions(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Row positions of this rank's queries and keys for masks built from per-token values: the whole
        row in order, or what the runtime's `mask_positions` says (context parallel)."""
        if self.runtime.mask_positions is None:
            row = torch.arange(length, device=device)
            return row, row
        return self.runtime.mask_positions(length, device)

    def output_rows(self, name: str, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """The Out path's first step: LM states `[N, H]` at `name`'s generation tokens, batch-major."""
        if name not in self.output_token_ids:
            raise ValueError(f"modality '{name}' has no Out path; set model.modalities.{name}.output_token_id")
        if hidden.shape[:2] != input_ids.shape:
            raise ValueError(f"the Out path needs the whole sequence's LM states {tuple(input_ids.shape)}, got "
                             f"{tuple(hidden.shape[:2])}; a sharded sequence (sequence or context parallel) "
                             "must be made whole first (ModelRuntime.gather_sequence)")
        return hidden[input_ids == self.output_token_ids[name]]

    def output_losses(self, hidden: torch.Tensor, input_ids: torch.Tensor, modality_targets: dict[str, torch.Tensor],
                      microbatch_rows: dict[str, list[int]] | None = None,
                      ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Per modality: (decoder loss sum, output-token count) over this batch's generation tokens.

        Targets are sample-aligned, `[B, K, D]`: sample b's first c_b rows are the targets of its c_b
        generation tokens (in order), the rest padding. So any split of the batch by samples keeps the
        targets with their tokens. The decoder runs even on zero tokens, so every rank joins it. With the
        runtime's `output_bridges[name]` the rows cross to the modality's layout, are decoded there and come back. With
        `gather_sequence` (a sharded sequence) `hidden` is this rank's positions and is made whole first.
        """
        sums, counts = {}, {}
        if self.runtime.gather_sequence is not None:
            hidden = self.runtime.gather_sequence(hidden)
        for name, targets in modality_targets.items():
            rows = self.output_rows(name, hidden, input_ids)
            per_sample = (input_ids == self.output_token_ids[name]).sum(1)
            sub = self.modality_submodules[name]
            target_rows = leading_rows(targets, per_sample, f"modality_targets['{name}']")
            there, back = self.runtime.output_bridges.get(name, (None, None))
            hint = (microbatch_rows or {}).get(out_key(name))
            pred = sub.decode(rows if there is None else there(rows, per_sample, hint))
            pred = pred if back is None else back(pred, per_sample, hint)
            sums[name], counts[name] = sub.output_loss(pred, target_rows)
        return sums, counts


def modules_by_name(model: MimoModel) -> dict[str, nn.Module]:
    """The model's modules by their config name: the LM under LANGUAGE ("language"), then each modality
    submodule under its model.modalities name. The one map that optimizers, checkpoints and layouts key by."""
    return {LANGUAGE: model.language_model, **dict(model.modality_submodules.items())}
