"""Real image-text data for an anyres modality (mimo.models.anyres): JSONL or WebDataset samples with images of any
size (JSONL `"image": [...]`: several, or none; WebDataset `key.0.png`, `key.1.png`, ...: several), each tiled as
LLaVA-NeXT tiles it (mimo.data.anyres_tiles; under OneVision an image of a several-image sample is one square tile
instead, mimo.models.anyres.tiled_images), so every image has its own number of placeholders (`anyres_rows` of its
size, which the encoded file's header gives without decoding it).

The reading, sharding and agreed skips are the native-resolution reader's (mimo.data.native_data.ItemSamples); a
sample with a video is skipped and counted. A batch holds plain `position_ids` `[B, S]`, each usable row's images as
`pixel_values` `[images, most tiles, C, S, S]` (zero-padded; zeros where this rank does not encode an image) with
their `image_sizes` `[images, 2]` (and, under OneVision, whether each is `tiled`, `[images]`), and
`modality_counts` (a usable row's images, 0 per skipped row and per row past a held-out batch's last sample), so
microbatches split by samples as for any modality.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mimo.config.schema import Config
from mimo.data.anyres_tiles import image_tiles, stacked_tiles
from mimo.data.batching import COUNTS
from mimo.data.image_text import Item, RecordReader, build_image_text_data
from mimo.data.native_data import ItemImageTextData
from mimo.data.native_images import header_size, open_rgb
from mimo.data.samples import BadSample, ImageRef
from mimo.models.anyres import anyres_rows, tiled_images
from mimo.models.multimodal import MimoModel


@dataclass(frozen=True)
class AnyResSpec:
    """The anyres modality of every sample: `tile`-pixel tiles of `patch`-pixel patches at the best of
    `grid_pinpoints`, `tile_rows` rows per tile, OneVision's `max_tiles`; `tokens` is the fewest placeholders an
    image gives (its overview tile's)."""

    name: str
    token_id: int
    tile: int
    patch: int
    grid_pinpoints: tuple[tuple[int, int], ...]
    max_tiles: int
    tile_rows: int
    kind: str = "vision"
    encoder: str = "vit"
    key: str = "pixel_values"
    empty: tuple = ()  # the images of a row past a held-out batch's last sample
    markers: tuple = ()  # the ids that open and close an image's placeholders: none

    @property
    def tokens(self) -> int:
        return self.tile_rows

    def item(self, refs: tuple[ImageRef, ...], items: int) -> tuple[int, int, bool]:
        """An image's (height, width), from its header, and whether it is tiled in a sample of `items` images
        (mimo.models.anyres.tiled_images). Raises BadSample (a video, or no image)."""
        if len(refs) != 1:
            raise BadSample(f"a video of {len(refs)} frames; the anyres modality '{self.name}' takes images")
        return (*header_size(refs[0]), tiled_images(self.max_tiles, [items])[0])

    def rows(self, shape: tuple[int, int, bool]) -> int:
        return anyres_rows(shape[:2], self.tile, self.patch, [list(p) for p in self.grid_pinpoints], self.max_tiles,
                           self.tile_rows, shape[2])

    def ids(self, shapes: list[tuple[int, int, bool]]) -> list[int]:
        """The LM ids of images of `shapes` (height, width, tiled), one run of placeholders after another."""
        return [self.token_id] * sum(self.rows(x) for x in shapes)

    def load(self, refs: tuple[ImageRef, ...], shape: tuple[int, int, bool]) -> np.ndarray:
        """The image's tiles, `[1 + rows * cols, 3, tile, tile]`, or its one square tile when not tiled
        (mimo.data.anyres_tiles.image_tiles)."""
        return image_tiles(np.asarray(open_rgb(refs[0])), [list(p) for p in self.grid_pinpoints], self.tile, shape[2])


class AnyResImageTextData(ItemImageTextData):
    """`ImageTextData` for one anyres modality (see the module docstring)."""

    def _assemble(self, items: list[Item], n: int, bad: torch.Tensor, indices: Sequence[int] | None = None) -> dict:
        """The batch of `n` rows from this rank's `items` (their own counts tell text-only rows; `indices` unused)."""
        spec = self.media[0]
        ids, labels, counts, shapes, tiles, _ = self._rows(items, n, bad)
        flags = [x[2] for x in shapes] if spec.max_tiles else None  # OneVision's: mimo.models.anyres.tiled_images
        vit = stacked_tiles(tiles, [x[:2] for x in shapes], spec.tile, flags)
        return {"input_ids": ids, "labels": labels,
                "position_ids": torch.arange(self.seq_len).expand(n, self.seq_len).contiguous(),
                "modality_inputs": {spec.name: {spec.encoder: vit}}, COUNTS: {spec.name: counts}}


def build_anyres_data(cfg: Config, model: MimoModel, reader: RecordReader) -> AnyResImageTextData:
    """The data set for data.name = "jsonl" or "webdataset" (records read by `reader`) under one anyres vision
    modality."""
    (name, m), = cfg.model.modalities.items()
    spec = AnyResSpec(name, m.token_id, m.vit.image, m.vit.patch, tuple(tuple(p) for p in m.anyres_grid_pinpoints),
                      m.anyres_max_tiles, model.modality_submodules[name].encoders["vit"].tokens_per_image)
    return build_image_text_data(cfg, model, reader, AnyResImageTextData, [spec])
