"""LLaVA-NeXT and LLaVA-OneVision in: a `LlavaNextForConditionalGeneration` or
`LlavaOnevisionForConditionalGeneration` checkpoint as a MimoModel whose `images` modality is an
`AnyResSubmodules` (tiles at the best grid resolution, rows put back in place, a newline row per line).

The returned ModelConfig describes the LM, the tower and the tiling (`anyres_grid_pinpoints`,
`anyres_max_tiles`), so mimo's builder makes the same model, `mimo generate` tiles its images
(mimo.data.anyres_tiles) and the shapes demo or JSONL / WebDataset data trains it (mimo.data.anyres_data);
mimo.export.llava_next writes the model back.
"""

from __future__ import annotations

import torch

from mimo.config.schema import ModelConfig
from mimo.hf.files import open_source
from mimo.hf.load import IMAGES, DeviceSpec, DTypeSpec, Source, find_prefix, llava_model_config, llava_parts
from mimo.hf.placement import is_meta
from mimo.models.anyres import AnyResSubmodules
from mimo.models.multimodal import MimoModel


def import_llava_next(source: Source, dtype: DTypeSpec = "auto",
                      device: DeviceSpec = "cpu") -> tuple[ModelConfig, MimoModel]:
    """The checkpoint's LM, tower, projector and `image_newline`, in its dtype or `dtype`, on `device`.
    Encoder inputs are transformers' processor outputs: `{"vit": {"pixel_values": [T, C, S, S],
    "image_sizes": [n, 2]}}` (a 5-D `[n, tiles, C, S, S]` batch flattened to its images' tiles)."""
    return _import_anyres(source, dtype, device, "llava_next")


def import_llava_onevision(source: Source, dtype: DTypeSpec = "auto",
                           device: DeviceSpec = "cpu") -> tuple[ModelConfig, MimoModel]:
    """A `LlavaOnevisionForConditionalGeneration` checkpoint, as `import_llava_next`: its anyres_max_N limit shrinks
    larger grids, and an image of a several-image prompt (transformers' `batch_num_images` > 1) is one square tile
    and a newline row, which the encoder inputs' `tiled` [n] bool flags say (mimo.models.anyres.tiled_images)."""
    return _import_anyres(source, dtype, device, "llava_onevision")


def _import_anyres(source: Source, dtype: DTypeSpec, device: DeviceSpec, kind: str) -> tuple[ModelConfig, MimoModel]:
    with open_source(source) as src:
        d = src.config()
        where = f"'{src.config_label}'"
        cfg = llava_model_config(d, where, kinds=(kind,))
        vit_cfg = cfg.modalities[IMAGES].vit
        if vit_cfg.tokens_per_image != (vit_cfg.image // vit_cfg.patch) ** 2:
            raise ValueError(f"{where}: LLaVA-NeXT packs each tile's patch grid, so the tower must give exactly its "
                             f"{(vit_cfg.image // vit_cfg.patch) ** 2} patches: vision_feature_select_strategy "
                             "'default' for a class-token tower (CLIP), 'full' for one without (SigLIP)")
        max_tiles = 0
        if kind == "llava_onevision":
            aspect = d.get("vision_aspect_ratio", "anyres_max_9")
            if not aspect.startswith("anyres_max_") or not aspect[len("anyres_max_"):].isdigit():
                raise ValueError(f"{where}: vision_aspect_ratio = '{aspect}' is not 'anyres_max_N'")
            max_tiles = int(aspect[len("anyres_max_"):])
        cfg.modalities[IMAGES].anyres_grid_pinpoints = [list(p) for p in d["image_grid_pinpoints"]]
        cfg.modalities[IMAGES].anyres_max_tiles = max_tiles
        lm, vit, proj = llava_parts(src, cfg, dtype, device)
        sub = AnyResSubmodules(vit, proj, cfg.llm.hidden, d["image_grid_pinpoints"], max_tiles).to(
            device=device, dtype=next(lm.parameters()).dtype)
        if not is_meta(device):
            name = find_prefix(src, "image_newline", "LLaVA-NeXT newline") + "image_newline"
            with torch.no_grad():
                src.read_into(name, sub.image_newline.data)
    return cfg, MimoModel(lm, {IMAGES: sub}, {IMAGES: cfg.modalities[IMAGES].token_id}).eval()
