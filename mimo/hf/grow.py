"""A checkpoint's embedding (or untied head) read as a grown vocabulary: `model.llm.extra_tokens` add rows after
the checkpoint's, initialised as transformers' `resize_token_embeddings` does by default (mean_resizing): a draw
from the multivariate normal with the old rows' mean and 1e-9 times their covariance, or the mean itself where that
covariance is not positive definite. The draw comes from a generator seeded by the caller, so every rank of every
layout makes the same rows (those of `resize_token_embeddings` after torch.manual_seed(seed)) and reads only the piece
it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mimo.hf.files import TensorSlice

COVARIANCE_SCALE = 1e-9
"""transformers' `epsilon` in `_init_added_embeddings_weights_with_mean`."""


@dataclass(frozen=True)
class GrownRows:
    """mimo's `[rows, ...]` tensor is checkpoint tensor `name` with new rows after its own, drawn with `seed` (`head`:
    an output head's, as `_get_resized_lm_head` draws them)."""

    name: str
    rows: int
    seed: int
    head: bool = False


def mean_resized_rows(old: torch.Tensor, added: int, seed: int, head: bool = False) -> torch.Tensor:
    """`added` new rows (fp32 `[added, H]`) for the `[V, H]` rows `old`, as transformers' mean resizing makes
    them: mean + L z, L the Cholesky factor of 1e-9 x the rows' covariance and z standard normal; the mean alone
    where that covariance is not positive definite. The generator, seeded `seed`, is used as the torch RNG is by
    `resize_token_embeddings` after torch.manual_seed(seed): the new `[V + added, H]` module's own initialisation
    first (an embedding's normal draw; an output head's uniform one, `head`), then z, so the rows are the same.
    Reads all of `old` (one fp32 copy)."""
    weight = old.to(torch.float32)
    mean = torch.mean(weight, dim=0)
    centered = weight - mean
    covariance = COVARIANCE_SCALE * (centered.T @ centered / weight.shape[0])
    symmetric = torch.isclose(covariance, covariance.mT, atol=1e-6).all()
    tril, info = torch.linalg.cholesky_ex(covariance)
    if not symmetric or info.item() != 0:
        return mean[None, :].repeat(added, 1)
    g = torch.Generator(device="cpu").manual_seed(seed)
    module_init = torch.empty((weight.shape[0] + added, weight.shape[1]))
    if head:
        module_init.uniform_(generator=g)
    else:
        module_init.normal_(generator=g)
    del module_init
    z = torch.empty((added, weight.shape[1]), dtype=torch.float32).normal_(generator=g)
    return mean + torch.matmul(tril, z.unsqueeze(-1)).squeeze(-1)


class GrownSlice:
    """A `TensorSlice` of `rows` rows: the checkpoint slice `old`'s, then `mean_resized_rows` (in `old`'s dtype).
    Rows are read by contiguous ranges; the new rows (and the whole of `old` they need) only when asked for."""

    def __init__(self, old: TensorSlice, rows: int, seed: int, head: bool = False):
        self.old, self.rows, self.seed, self.head = old, rows, seed, head
        self.old_rows = old.get_shape()[0]
        self._new: torch.Tensor | None = None

    def get_shape(self) -> list[int]:
        return [self.rows, *self.old.get_shape()[1:]]

    def new_rows(self) -> torch.Tensor:
        if self._new is None:
            old = self.old[:]
            self._new = mean_resized_rows(old, self.rows - self.old_rows, self.seed, self.head).to(old.dtype)
        return self._new

    def __getitem__(self, index: Any) -> torch.Tensor:
        index = index if isinstance(index, tuple) else (index,)
        first, rest = (index[0] if index else slice(None)), index[1:]
        if not isinstance(first, slice) or first.step not in (None, 1):
            raise ValueError(f"a grown vocabulary is read by contiguous row ranges, not {first!r}")
        lo, hi, _ = first.indices(self.rows)
        hi = max(lo, hi)
        parts = []
        if lo < self.old_rows:
            parts.append(self.old[(slice(lo, min(hi, self.old_rows)), *rest)])
        if hi > self.old_rows:
            new = self.new_rows()[(slice(max(lo, self.old_rows) - self.old_rows, hi - self.old_rows), *rest)]
            parts.append(new)
        if not parts:
            return self.old[(slice(0, 0), *rest)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
