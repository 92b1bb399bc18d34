"""Running an encoder on inputs of different lengths, or on none, and turning padded tensors into rows.

Variable length: a modality's encoder kwargs may carry `output_lengths` (`[n]` integers, one per
input): the inputs are padded to one length, and input i's encoder output `[s, h]` keeps only its
first `output_lengths[i]` rows, so audio clips of different durations give different numbers of
placeholder tokens. Pad every batch to the same length (a data-set constant, as Whisper pads to
30 s): the encoder attends over the padding too, so a length that depended on the batch would make
the result depend on how samples were split.

No input: a microbatch or data lane may hold none of a modality's inputs (zero rows). The encoder
then runs on one all-zero stand-in input and keeps none of its rows, so every data-parallel rank
makes the same collectives and the encoder's gradient is exactly zero. A step whose global batch holds
no input of a modality does not train its encoders and input projections at all (`fed_modalities`,
`MimoModel.unfed_parameters`): their gradients are None on every layout, as on one process.
"""

from __future__ import annotations

import torch
from torch import nn

OUTPUT_LENGTHS = "output_lengths"


def leading_row_index(shape: torch.Size, counts: torch.Tensor, what: str) -> torch.Tensor:
    """The rows of `x.flatten(0, 1)` (`x` of `shape` `[n, K, ...]`) that are each entry's first `counts[i]`, in
    order, as an index on the host for `counts` on the host. Gathering them needs no sync and traces under
    torch.compile."""
    if len(shape) < 3 or counts.dim() != 1 or shape[0] != counts.shape[0]:
        raise ValueError(f"{what} must be [n, K, ...] with one count per entry; got shape {tuple(shape)} and "
                         f"{tuple(counts.shape)} counts")
    if counts.numel() and int(counts.max()) > shape[1]:
        raise ValueError(f"{what}: an entry needs {int(counts.max())} rows but only {shape[1]} are given; pad "
                         "every entry to the longest one")
    rows = torch.arange(shape[1])
    return (torch.arange(shape[0])[:, None] * shape[1] + rows)[rows[None, :] < counts[:, None]]


def leading_rows(x: torch.Tensor, counts: torch.Tensor, what: str) -> torch.Tensor:
    """Rows `x[i, :counts[i]]` of a `[n, K, ...]` tensor, concatenated in order into `[sum(counts), ...]`: the
    `leading_row_index` of `counts` read to the host (one sync where they are on a GPU)."""
    index = leading_row_index(x.shape, counts.cpu(), what)
    return x.flatten(0, 1)[index.to(x.device)]


def fed_modalities(modality_inputs: dict | None) -> frozenset[str]:
    """The modalities of a batch's `modality_inputs` (`{modality: {encoder: {keyword: tensor}}}`) that hold at least
    one input: one of their tensors has a leading size above 0. Pure, on the host."""
    return frozenset(name for name, encoders in (modality_inputs or {}).items()
                     if any(isinstance(t, torch.Tensor) and t.dim() and t.shape[0] > 0
                            for kwargs in encoders.values() for t in kwargs.values()))


def run_encoder(encoder: nn.Module, kwargs: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The encoder's output (first element if it returns a tuple), trimmed to `output_lengths` if given."""
    lengths = kwargs.get(OUTPUT_LENGTHS)
    inputs = {k: v for k, v in kwargs.items() if k != OUTPUT_LENGTHS}
    sizes = {v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor)}
    empty = sizes == {0}
    if empty:
        inputs = {k: v.new_zeros(1, *v.shape[1:]) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = encoder(**inputs)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if empty:
        return out[:0]
    if lengths is not None:
        out = leading_rows(out, lengths, f"encoder '{name}' output ({OUTPUT_LENGTHS} given)")
    return out
