"""Checks of a whole global batch, run on every rank that holds it before any collective, so that a bad
sample fails with the same message everywhere instead of in one data lane or pipeline stage."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from mimo.data.batching import COUNTS, input_counts, leading_sizes, rows_per_sample
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import MimoModel
from mimo.models.sample_rows import OUTPUT_LENGTHS


def check_counts(batch: dict) -> None:
    """Each modality's `modality_counts` must account for every one of its inputs: the split by samples
    slices inputs by the counts' running sums, so a short count would silently drop inputs."""
    for name, counts in batch.get(COUNTS, {}).items():
        total = int(counts.sum())
        for key, size in leading_sizes(batch.get("modality_inputs", {}).get(name, {})).items():
            if size != total:
                raise ValueError(f"modality_counts['{name}'] sums to {total} but input '{name}.{key}' holds {size} "
                                 f"items; give every sample the number of '{name}' inputs it holds")


def check_token_ids(batch: dict, vocab: int, placeholder_ids: Iterable[int] = ()) -> None:
    """Every token id and label of the global batch inside the LM's vocabulary [0, vocab) (labels may be
    IGNORE_INDEX; placeholders are replaced before the embedding). An id past the embedding table or the
    head would otherwise stop a GPU with a device-side assert, or make the chunked loss NaN, far from
    its cause: usually a tokenizer with more ids than model.llm.vocab."""
    exempt = {"input_ids": list(placeholder_ids), "labels": [IGNORE_INDEX]}
    for key, skip in exempt.items():
        ids = batch.get(key)
        if ids is None:
            continue
        ids = ids.cpu()
        outside = (ids < 0) | (ids >= vocab)
        if outside.any():  # the exemptions are looked up only then: a per-step check of the whole batch
            outside &= ~torch.isin(ids, torch.tensor(skip, dtype=torch.long, device=ids.device))
        if outside.any():
            where = tuple(outside.nonzero()[0].tolist())
            raise ValueError(f"{key}{list(where)} = {int(ids[where])} lies outside the LM's vocabulary [0, {vocab}); "
                             f"set model.llm.vocab to at least {int(ids[outside].max()) + 1} (the tokenizer's size) "
                             "or fix the data")


def check_placeholders(batch: dict, name: str, token_id: int,
                       rows_per_input: int | Callable[[dict], torch.Tensor] | None) -> None:
    """Each sample's placeholder tokens of modality `name` against the rows its inputs will become, on
    the whole global batch, so that every rank holding the batch raises the same error before any
    collective (a mismatch found later, in one data lane or pipeline stage, would leave the other ranks
    waiting). Rows per input come from the inputs' `output_lengths` (clips) or `rows_per_input` (an
    encoder with a fixed number, e.g. a ViT, or a function of the encoder's inputs, e.g. a native-resolution
    tower's of `grid_thw`); with neither, the alignment's own check applies.
    """
    ids = batch["input_ids"]
    kwargs = next(iter(batch.get("modality_inputs", {}).get(name, {}).values()), {})
    counts = input_counts(batch, name).cpu()
    n = int(counts.sum())
    if OUTPUT_LENGTHS in kwargs:
        per_input = kwargs[OUTPUT_LENGTHS].long().cpu()
    elif callable(rows_per_input):
        per_input = rows_per_input(kwargs).long().cpu()
    elif rows_per_input is not None:
        per_input = torch.full((n,), rows_per_input, dtype=torch.long)
    else:
        return
    if per_input.numel() != n:
        return  # inputs and counts disagree: check_counts names that error
    expected = rows_per_sample(counts, per_input)
    got = (ids == token_id).sum(1).cpu()
    bad = (got != expected).nonzero().flatten().tolist()
    if bad:
        s = bad[0]
        raise ValueError(f"Number of {name} tokens ({int(got[s])}) does not match number of {name} embeddings "
                         f"({int(expected[s])}) in sample {s} of the global batch")


def check_vocabulary(model: MimoModel, batch: dict) -> None:
    """Every token id and label of `batch` inside the LM's vocabulary (placeholders exempt in input_ids)."""
    check_token_ids(batch, model.language_model.cfg.vocab, model.special_token_ids.values())


def check_batch(model: MimoModel, batch: dict, modalities: Iterable[str] | None = None) -> None:
    """A whole global batch (with `modality_counts`) against the model's placeholders: counts against
    inputs, then each sample's placeholders against the rows its inputs will give. Every rank holding
    the batch reaches the same verdict before any collective, whichever lane a bad sample would reach.
    Rows per input are the submodules' own `rows_per_input` (an anyres modality's, of its image sizes), else the
    encoder's. Modalities with several encoders are left to the alignment's own check. The whole-model check
    (`modalities` None) also holds every token id and label to the LM's vocabulary."""
    check_counts(batch)
    if modalities is None:
        check_vocabulary(model, batch)
    for name in model.modality_submodules.keys() if modalities is None else modalities:
        sub = model.modality_submodules[name]
        if len(sub.encoders) == 1:
            (encoder,) = sub.encoders.values()
            rows = (getattr(sub, "rows_per_input", None) or getattr(encoder, "rows_per_input", None)
                    or getattr(encoder, "tokens_per_image", None))
            check_placeholders(batch, name, model.special_token_ids[name], rows)
