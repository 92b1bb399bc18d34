"""What a run's batches are made of, for the progress bar and summary.json: their padding share, and each module's
share of the step's model FLOPs.

Padding: a row's real tokens are its prefix up to its last non-pad input or last label
(mimo.data.packing.sample_lengths): a padded sample's own tokens, or a packed row's documents, which lie at its
start. The rest of the row is padding. The pad id is the data set's tokenizer's; a data set without one
(synthetic) has full rows. Where a rank decodes only its own rows (a data-parallel layout reading real data,
mimo.data.image_text), only the rows whose text it holds count, so that rank 0 reports the padding of its LM
lane's rows.

FLOPs: mimo.models.flops.module_step_flops of each global batch (the LM, and each modality's encoder and
projector), as the trainer's model FLOP/s count them: what a user weighs when giving encoders and LM their layouts.

Counted on the host from each global batch as the data set gives it, before any collective; a resumed run counts
the batches since it resumed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mimo.config.schema import ModelConfig
from mimo.data.packing import sample_lengths
from mimo.data.samples import special_ids
from mimo.models.flops import module_step_flops


class BatchShares:
    """Real and row tokens, and model FLOPs by module, of the global batches counted so far (`count`)."""

    def __init__(self, data: Any, model: ModelConfig):
        tok = getattr(data, "tok", None)
        self.pad_id = None if tok is None else special_ids(tok)[2]
        self.data, self.model = data, model
        self.real = self.rows = 0
        self.module_flops: Counter[str] = Counter()

    def count(self, batch: dict) -> None:
        """Add a global batch (its rows as the module docstring says). Not collective."""
        self.module_flops.update(module_step_flops(self.model, batch))
        ids, labels = batch["input_ids"], batch.get("labels")
        held = getattr(self.data, "text_rows", None)
        if held is not None:
            keep = sorted(held)
            ids, labels = ids[keep], None if labels is None else labels[keep]
        self.rows += ids.numel()
        self.real += ids.numel() if self.pad_id is None else int(sample_lengths(ids, labels, self.pad_id).sum())

    def padding(self) -> float | None:
        """Padding tokens over row tokens of the counted batches, to 4 digits; None before any."""
        return round(1 - self.real / self.rows, 4) if self.rows else None

    def flops(self) -> dict[str, float]:
        """Each module's share of the counted batches' model FLOPs, to 4 digits (ModelConfig.module_names' order)."""
        total = sum(self.module_flops.values())
        return {m: round(self.module_flops[m] / total, 4) for m in self.model.module_names
                if total and m in self.module_flops}

    def postfix(self) -> dict[str, float]:
        """The progress bar's `pad` field (none before any batch)."""
        share = self.padding()
        return {} if share is None else {"pad": share}
