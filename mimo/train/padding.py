"""The padding share of a run's batches, for the progress bar and summary.json.

A row's real tokens are its prefix up to its last non-pad input or last label (mimo.data.packing.sample_lengths):
a padded sample's own tokens, or a packed row's documents, which lie at its start. The rest of the row is padding.
The pad id is the data set's tokenizer's; a data set without one (synthetic) has full rows. Counted on the host
from each global batch as the data set gives it, before any collective; where a rank decodes only its own rows
(a data-parallel layout reading real data, mimo.data.image_text), the rows whose text it holds, so that rank 0
reports the padding of its LM lane's rows. A resumed run counts the batches since it resumed.
"""

from __future__ import annotations

from typing import Any

from mimo.data.packing import sample_lengths
from mimo.data.samples import special_ids


class PaddingTally:
    """Real and row tokens of the global batches counted so far (`count`), and their padding share."""

    def __init__(self, data: Any):
        tok = getattr(data, "tok", None)
        self.pad_id = None if tok is None else special_ids(tok)[2]
        self.data = data
        self.real = self.rows = 0

    def count(self, batch: dict) -> None:
        """Add a global batch's rows (those whose text this rank holds, see the module docstring). Not collective."""
        ids, labels = batch["input_ids"], batch.get("labels")
        held = getattr(self.data, "text_rows", None)
        if held is not None:
            keep = sorted(held)
            ids, labels = ids[keep], None if labels is None else labels[keep]
        self.rows += ids.numel()
        self.real += ids.numel() if self.pad_id is None else int(sample_lengths(ids, labels, self.pad_id).sum())

    def share(self) -> float | None:
        """Padding tokens over row tokens of the counted batches, to 4 digits; None before any."""
        return round(1 - self.real / self.rows, 4) if self.rows else None

    def postfix(self) -> dict[str, float]:
        """The progress bar's `pad` field (none before any batch)."""
        share = self.share()
        return {} if share is None else {"pad": share}
