"""A layout-independent global batch order, shared by the in-memory demo sets.

The global batch at a step depends only on (step, global_batch, seed): epochs of seeded permutations,
concatenated. Any layout therefore sees the same global batch at every step, and a resumed run
continues exactly where it stopped. Subclasses hold `train` samples and define `collate`; those with
held-out `eval` samples also give them as whole global batches, in order, for periodic evaluation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mimo.models.loss import IGNORE_INDEX


class SeededBatches:
    """Mixin: `global_batch(step, size, seed)` = `collate` of the step's slice of the seeded order."""

    train: list[Any]
    eval: list[Any]

    def collate(self, samples: list[Any]) -> dict:
        raise NotImplementedError

    def global_batch_indices(self, step: int, global_batch: int, seed: int) -> np.ndarray:
        n = len(self.train)
        start = step * global_batch
        out: list[int] = []
        while len(out) < global_batch:
            epoch, offset = divmod(start + len(out), n)
            perm = np.random.default_rng([seed, epoch]).permutation(n)
            out.extend(perm[offset : offset + global_batch - len(out)].tolist())
        return np.asarray(out)

    def global_batch(self, step: int, global_batch: int, seed: int) -> dict:
        return self.collate([self.train[i] for i in self.global_batch_indices(step, global_batch, seed)])

    def held_out_batches(self, global_batch: int) -> int:
        """How many global batches the held-out samples fill (the last one may be partly empty)."""
        return -(-len(getattr(self, "eval", ())) // global_batch)

    def held_out_batch(self, index: int, global_batch: int) -> dict:
        """Global batch `index` of the held-out samples in order. The last one is filled up with the
        first held-out samples, whose labels are all IGNORE_INDEX: they carry no loss."""
        n = len(self.eval)
        rows = list(range(index * global_batch, min((index + 1) * global_batch, n)))
        fill = global_batch - len(rows)
        batch = self.collate([self.eval[i] for i in rows + [i % n for i in range(fill)]])
        if fill:
            batch["labels"][global_batch - fill:] = IGNORE_INDEX
        return batch
