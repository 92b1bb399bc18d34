"""A layout-independent global batch order, shared by the in-memory demo sets.

The global batch at a step depends only on (step, global_batch, seed): epochs of seeded permutations,
concatenated. Any layout therefore sees the same global batch at every step, and a resumed run
continues exactly where it stopped. Subclasses hold `train` samples and define `collate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SeededBatches:
    """Mixin: `global_batch(step, size, seed)` = `collate` of the step's slice of the seeded order."""

    train: list[Any]

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
