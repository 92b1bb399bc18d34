"""Real image/video-text data for a native-resolution (`kind = "native_vision"`) modality: JSONL or WebDataset
samples with images of any size (JSONL `"image": [...]`: several, or none; WebDataset `key.0.png`, ...: several),
or one video's frames (JSONL `"video"`), each resized within the tower's [min_pixels, max_pixels]
(mimo.data.native_images), so every sample has its own number of placeholders.

The rest is `ImageTextData`'s (order, sharding, agreed skips), except that every rank reads every row's items'
headers for their grids (the placeholders and M-RoPE positions follow from them), so that all ranks hold every
row's placeholders whichever rows they read; a rank that encodes the items decodes the pixels. A row is BOS, each
item's placeholders in order (one run after another; each between `native.vision_start_token_id` and
`vision_end_token_id` when they are set, as transformers' Qwen2-VL processor lays them out), then the text;
placeholders and markers are inputs, never targets. A batch holds `position_ids` `[B, S, 3]` (mimo.models.mrope:
markers count as text, as in transformers' get_rope_index), each usable row's items as `pixel_values`
`[items, most patches, C*T*P*P]` (padded; the tower keeps each item's `grid_thw` patches) and `modality_counts` (a
usable row's items, 0 per skipped one; one empty stand-in for a row past a held-out batch's last sample), so
microbatches split by samples as for any modality. A row whose text a rank does not read holds its items'
placeholders (and markers) alone, so that the batch's checks see every item's rows.
The per-item reader (`ItemSamples`, `ItemImageTextData._rows`) serves any modality whose items give their own
placeholder counts: an anyres one too (mimo.data.anyres_data).
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mimo.config.schema import Config, NativeViTConfig
from mimo.data.batching import COUNTS
from mimo.data.image_text import (
    FAIL,
    SKIP,
    USABLE,
    ImageTextData,
    Item,
    RecordReader,
    _Samples,
    build_image_text_data,
)
from mimo.data.native_images import grid_of, header_size, item_ids, load_item, tokens_of
from mimo.data.samples import BadSample, ImageRef, Record, encode_text
from mimo.models.loss import IGNORE_INDEX
from mimo.models.mrope import mrope_positions
from mimo.models.multimodal import MimoModel

EMPTY_GRID = (1, 0, 0)
"""The grid of a row past a held-out batch's last sample: no patches."""


@dataclass(frozen=True)
class NativeSpec:
    """The native-resolution modality of every sample; `tokens` is the fewest placeholders an item gives. The
    methods are what `ItemSamples` asks of any modality whose items give placeholders of their own sizes."""

    name: str
    token_id: int
    cfg: NativeViTConfig
    kind: str = "native_vision"
    encoder: str = "visual"
    key: str = "pixel_values"
    empty: tuple = (EMPTY_GRID,)  # the items of a row past a held-out batch's last sample

    @property
    def tokens(self) -> int:
        return self.cfg.min_pixels // (self.cfg.patch * self.cfg.merge) ** 2

    def item(self, refs: tuple[ImageRef, ...], items: int) -> tuple[int, int, int]:
        """An item's grid, from its first image's header (the sample's number of `items` changes no grid). Raises
        BadSample."""
        return grid_of(header_size(refs[0]), len(refs), self.cfg)

    def rows(self, grid: tuple[int, int, int]) -> int:
        return tokens_of(grid, self.cfg)

    @property
    def markers(self) -> tuple[int, ...]:
        """The ids that open and close every item's placeholders (none: the runs stand bare)."""
        return (self.cfg.vision_start_token_id, self.cfg.vision_end_token_id) if self.cfg.marked else ()

    def ids(self, shapes: list[tuple[int, int, int]]) -> list[int]:
        """The LM ids of items of `shapes`, one after another (each between the markers, if any)."""
        return [i for x in shapes for i in item_ids(self.rows(x), self.token_id, self.cfg)]

    def load(self, refs: tuple[ImageRef, ...], grid: tuple[int, int, int]) -> np.ndarray:
        """The item's patches (of its `grid`, which its pixels give again)."""
        return load_item(refs, self.cfg)[0]

    def step(self, fps: float) -> float:
        """M-RoPE's temporal step of a video of `fps` (0: an image): tokens per second x seconds per temporal patch
        on Qwen2.5-VL, 1 otherwise."""
        if fps and self.cfg.family == "qwen2_5_vl":
            return self.cfg.tokens_per_second * self.cfg.temporal_patch / fps
        return 1.0


def record_items(rec: Record) -> list[tuple[ImageRef, ...]]:
    """The items of a record in placeholder order: its video's frames, or each of its images (none: text only)."""
    if rec.frames:
        return [rec.frames]
    return [(ref,) for ref in rec.images or ((rec.image,) if rec.image is not None else ())]


class ItemSamples(_Samples):
    """One request: the row's text after as many placeholders as its images or video give (each item's run in
    order; `media[0].item`, told the sample's item count, and `.rows`), every item's shape and the video's fps
    always, their pixels (`media[0].load` of each item and its shape) where this rank encodes them."""

    def __getitem__(self, request: tuple[int, int, bool, frozenset[str]]) -> Item:
        row, index, want_text, wanted = request
        rec, spec = self.records[index], self.media[0]
        try:
            items = record_items(rec)
            shapes = [spec.item(refs, len(items)) for refs in items]
            n = sum(spec.rows(x) for x in shapes)
            ids, labels = encode_text(rec, self.tok, 0, spec.token_id, self.seq_len, spec.ids(shapes),
                                      self.prompt_format)
            if ids.count(spec.token_id) != n:
                what = "video" if rec.frames else f"{len(items)} image(s)"
                raise BadSample(f"its {what} give {n} placeholders ({spec.token_id}); with its text they do not fit "
                                f"data.seq_len = {self.seq_len}, or the text writes the placeholder id")
            marker = next((m for m in spec.markers if ids.count(m) != len(items)), None)
            if marker is not None:
                raise BadSample(f"its text writes the vision marker id {marker}, which only opens or closes an item")
            outside = [i for i in ids if i != spec.token_id and not 0 <= i < self.vocab] if self.vocab else []
            if outside:
                raise BadSample(f"token id {outside[0]} lies outside the LM's vocabulary [0, {self.vocab})")
            pixels = [spec.load(refs, x) for refs, x in zip(items, shapes)] if spec.name in wanted else None
        except BadSample as e:
            return row, None, None, {}, f"sample '{rec.key}': {e}", SKIP
        except Exception as e:  # any other error must reach every rank, not only this one
            return row, None, None, {}, f"sample '{rec.key}' failed to load: {e!r}\n{traceback.format_exc()}", FAIL
        inputs = {spec.name: (pixels, shapes, rec.fps if rec.frames else 0.0)}
        return row, ids if want_text else None, labels if want_text else None, inputs, "", USABLE


class ItemImageTextData(ImageTextData):
    """`ImageTextData` for one modality whose items give their own numbers of placeholders (`ItemSamples`);
    subclasses lay out the encoder inputs and positions (`_assemble`) from `_rows`."""

    reader = ItemSamples

    def requests(self, indices: Any) -> list[tuple[int, int, bool, frozenset[str]]]:
        """(row, sample index, want text, modalities to decode) for every row of `indices`: a row whose text this
        rank does not read and whose items it does not encode still gives their shapes (headers only), so that
        every rank holds every row's placeholders as the readers do (the colocated bridges' `microbatch_rows`, the
        step's FLOPs), whichever rows its data lanes hold."""
        text, inputs, name = self.text_rows, self.input_rows, self.media[0].name
        return [(row, int(i), text is None or row in text,
                 frozenset({name}) if inputs is None or row in inputs[name] else frozenset())
                for row, i in enumerate(indices)]

    def _rows(self, items: list[Item], n: int, bad: torch.Tensor) -> tuple:
        """(ids, labels, counts, shapes, pixels, texts) of the batch: every item's shape and pixels (None where
        this rank does not encode it) in order, and each row whose text this rank reads -> (its shapes, fps)."""
        spec = self.media[0]
        ids = torch.full((n, self.seq_len), self.pad, dtype=torch.long)
        labels = torch.full((n, self.seq_len), IGNORE_INDEX, dtype=torch.long)
        found = {row: (row_ids, row_labels, inputs.get(spec.name)) for row, row_ids, row_labels, inputs, _, _ in items}
        shapes, pixels, counts, texts = [], [], torch.zeros(n, dtype=torch.long), {}
        for row in range(n):
            if bad[row]:
                continue
            row_ids, row_labels, item = found.get(row, (None, None, None))
            row_shapes = list(spec.empty) if item is None else item[1]
            counts[row] = len(row_shapes)
            shapes += row_shapes
            pixels += [None] * len(row_shapes) if item is None or item[0] is None else item[0]
            if row_ids is None and item is not None:  # items whose text this rank does not read
                alone = spec.ids(row_shapes)
                ids[row, : len(alone)] = torch.tensor(alone)
            if row_ids is not None:
                ids[row, : len(row_ids)] = torch.tensor(row_ids)
                labels[row, : len(row_labels)] = torch.tensor(row_labels)
                texts[row] = (row_shapes, item[2])
        return ids, labels, counts, shapes, pixels, texts


class NativeImageTextData(ItemImageTextData):
    """`ImageTextData` for one native-resolution modality (see the module docstring)."""

    def _assemble(self, items: list[Item], n: int, bad: torch.Tensor, indices: Sequence[int] | None = None) -> dict:
        """The batch of `n` rows from this rank's `items` (their own counts tell text-only rows; `indices` unused)."""
        spec = self.media[0]
        ids, labels, counts, grids, patches, texts = self._rows(items, n, bad)
        positions = torch.arange(self.seq_len).expand(n, self.seq_len)[..., None].repeat(1, 1, 3)
        for row, (row_grids, fps) in texts.items():
            grid_thw = torch.tensor(row_grids, dtype=torch.long).reshape(-1, 3)
            positions[row] = mrope_positions(ids[row: row + 1], spec.token_id, grid_thw, spec.cfg.merge,
                                             torch.tensor([spec.step(fps)] * len(row_grids)))[0]
        width = max([len(p) for p in patches if p is not None] + [1])
        pixels = torch.zeros(len(grids), width, spec.cfg.patch_pixels)
        for i, p in enumerate(patches):
            if p is not None:
                pixels[i, : len(p)] = torch.from_numpy(p)
        grid_thw = torch.tensor(grids, dtype=torch.long).reshape(-1, 3)
        return {"input_ids": ids, "labels": labels, "position_ids": positions,
                "modality_inputs": {spec.name: {spec.encoder: {"pixel_values": pixels, "grid_thw": grid_thw}}},
                COUNTS: {spec.name: counts}}


def build_native_data(cfg: Config, model: MimoModel, reader: RecordReader) -> NativeImageTextData:
    """The data set for data.name = "jsonl" or "webdataset" (records read by `reader`) under one native_vision
    modality."""
    (name, m), = cfg.model.modalities.items()
    return build_image_text_data(cfg, model, reader, NativeImageTextData, [NativeSpec(name, m.token_id, m.native)])

