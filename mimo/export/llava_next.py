"""Write a MimoModel whose image modality tiles anyres images (mimo.models.anyres.AnyResSubmodules) as a
`LlavaNextForConditionalGeneration` directory, or, when it limits grids to anyres_max_N tiles, as a
`LlavaOnevisionForConditionalGeneration` one: the reverse of mimo.hf.llava_next.

Weights stream one tensor at a time like every export (mimo.export.stream), under the names LLaVA uses
(`language_model.*`, `vision_tower.*`, `multi_modal_projector.*`, `image_newline`). config.json records the grid
pinpoints, the feature layer and strategy; with a tokenizer the directory also gets the `<image>` token, an image
processor that tiles as the model expects (mimo's bicubic resize and [-1, 1] pixels per tile) and a processor
`AutoProcessor` loads, bos/eos/pad ids and generation_config.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mimo.config.schema import ViTConfig
from mimo.data.tokenizer import IMAGE, require_transformers
from mimo.export.config import hf_act, hf_text_config, hf_vision_config
from mimo.export.hf import TokenizerSpec, act_name, llava_parts, resolve_tokenizer, unused_tower_tensors
from mimo.export.stream import Entry, LiveSource, SourceOf, gather_entries, write_hf_dir
from mimo.export.tokens import BICUBIC, PIXEL_MEAN, PIXEL_STD, token_ids, write_video_processor_config
from mimo.hf.names import llm_names, projector_names, vit_names, with_prefix
from mimo.models.anyres import AnyResSubmodules
from mimo.models.multimodal import MimoModel

NEWLINE = "image_newline"
VIDEO = "<video>"


def anyres_parts(model: MimoModel) -> tuple[str, AnyResSubmodules]:
    """The model's one anyres image modality, checked as LLaVA-NeXT packs it (every patch of every tile)."""
    name, vit, _ = llava_parts(model)
    sub = model.modality_submodules[name]
    if not isinstance(sub, AnyResSubmodules):
        raise ValueError(f"modality '{name}' does not tile anyres images; export it as LLaVA (export_llava)")
    side = vit.cfg.image // vit.cfg.patch
    if vit.tokens_per_image != side**2:
        raise ValueError(f"modality '{name}': LLaVA-NeXT packs each tile's {side**2} patches, but the tower hands "
                         f"the projector {vit.tokens_per_image} rows; drop the class token (vit.drop_class_token = "
                         "true) and keep every patch (vit.drop_first_patch = false)")
    return name, sub


def anyres_tensors(model: MimoModel, name: str, dtype: torch.dtype | None, source_of: SourceOf) -> dict[str, Entry]:
    """Every tensor of the directory under LLaVA's names, lazily read one at a time from `source_of(module)`."""
    sub = model.modality_submodules[name]
    vit, proj, lm = sub.encoders["vit"], sub.input_projections[0], model.language_model
    tensors = gather_entries(lm, llm_names(lm, "language_model.model.", "language_model."), dtype, source_of)
    tensors.update(gather_entries(vit, with_prefix(vit_names(vit), "vision_tower."), dtype, source_of))
    # The tower's final LayerNorm is unused by LLaVA but expected by the class: stored as the identity.
    tensors.update(unused_tower_tensors(vit, next(iter(tensors.values())).dtype, "vision_tower.", source_of))
    tensors.update(gather_entries(proj, with_prefix(projector_names(proj), "multi_modal_projector."), dtype,
                                  source_of))
    tensors.update(gather_entries(sub, {NEWLINE: NEWLINE}, dtype, source_of))
    return tensors


def anyres_config(model: MimoModel, name: str, dt: str, ids: dict[str, int | None]) -> Any:
    """A LlavaNextConfig (no tile limit) or LlavaOnevisionConfig (`max_tiles` as anyres_max_N)."""
    tf = require_transformers()
    sub = model.modality_submodules[name]
    vit, proj, lm = sub.encoders["vit"], sub.input_projections[0], model.language_model
    field = f"model.modalities.{name}"
    common = dict(
        vision_config=hf_vision_config(vit.cfg, f"{field}.vit", dt).to_dict(),
        text_config=hf_text_config(lm.cfg, dt, ids).to_dict(), image_token_index=model.special_token_ids[name],
        vision_feature_layer=-1, vision_feature_select_strategy=strategy_of(vit.cfg),
        image_grid_pinpoints=[list(p) for p in sub.grid_pinpoints],
        projector_hidden_act=hf_act(act_name(proj.act), f"{field}.projector.act"),
        multimodal_projector_bias=proj.fc1.bias is not None, tie_word_embeddings=lm.cfg.tie_embeddings, dtype=dt)
    if sub.max_tiles:
        config = tf.LlavaOnevisionConfig(vision_aspect_ratio=f"anyres_max_{sub.max_tiles}",
                                         video_token_index=free_video_id(model, name), **common)
        config.architectures = ["LlavaOnevisionForConditionalGeneration"]
    else:
        config = tf.LlavaNextConfig(image_seq_length=vit.tokens_per_image, **common)
        config.architectures = ["LlavaNextForConditionalGeneration"]
    return config


def strategy_of(vit: ViTConfig) -> str:
    """LLaVA's vision_feature_select_strategy for the tower: 'default' drops its first output token."""
    return "default" if vit.drops_first_token else "full"


def free_video_id(model: MimoModel, name: str) -> int:
    """OneVision's video placeholder (its config needs one; mimo has no video here): the id after the image's,
    unless that one is the vocabulary's end."""
    image = model.special_token_ids[name]
    return image + 1 if image + 1 < model.language_model.cfg.vocab else image - 1


def anyres_image_processor(sub: AnyResSubmodules) -> Any:
    """Tiles at the best of the pinpoints plus the overview tile, each resized (bicubic) to the tower's size and
    normalised to [-1, 1] as mimo's pixels (mimo.export.tokens.image_processor)."""
    tf = require_transformers()
    side = sub.encoders["vit"].cfg.image
    size = {"height": side, "width": side}
    common = dict(size=size, image_grid_pinpoints=[list(p) for p in sub.grid_pinpoints], resample=BICUBIC,
                  image_mean=PIXEL_MEAN, image_std=PIXEL_STD, rescale_factor=1 / 255, do_convert_rgb=True,
                  do_pad=True)
    if sub.max_tiles:
        return tf.LlavaOnevisionImageProcessorPil(**common)
    return tf.LlavaNextImageProcessorPil(crop_size=size, do_center_crop=True, **common)


def save_anyres_processor(tok: Any, sub: AnyResSubmodules, directory: Path) -> None:
    """processor_config.json (with the image processor) and the tokenizer's files: `AutoProcessor` expands each
    `<image>` into as many placeholders as the model gives that image rows."""
    tf = require_transformers()
    vit = sub.encoders["vit"].cfg
    images = anyres_image_processor(sub)
    common = dict(image_token=IMAGE, vision_feature_select_strategy=strategy_of(vit),
                  chat_template=getattr(tok, "chat_template", None))
    if not sub.max_tiles:
        tf.LlavaNextProcessor(image_processor=images, tokenizer=tok, patch_size=vit.patch,
                              num_additional_image_tokens=int(vit.class_token), **common).save_pretrained(directory)
        return
    if common["chat_template"] is None:
        del common["chat_template"]
    # num_image_tokens counts the tower's outputs, its class token included: 'default' drops it again.
    tower_rows = (vit.image // vit.patch) ** 2 + int(vit.drops_first_token)
    write_video_processor_config(directory, "LlavaOnevisionProcessor", images, "LlavaOnevisionVideoProcessor",
                                 ("image_grid_pinpoints",), num_image_tokens=tower_rows, video_token=VIDEO,
                                 vision_aspect_ratio=f"anyres_max_{sub.max_tiles}", **common)
    tok.save_pretrained(directory)


def export_llava_next(model: MimoModel, directory: str | Path, dtype: torch.dtype | None = None,
                      tokenizer: TokenizerSpec = None, source_of: SourceOf = LiveSource,
                      max_shard_bytes: int | None = None) -> Path:
    """Tower + projector + newline + LM as a LLaVA-NeXT directory (LLaVA-OneVision when the modality limits its
    grids, `max_tiles` > 0) that transformers loads with the same logits. With `tokenizer` (`byte`, a Hugging
    Face tokenizer directory or object) also the tokenizer with `<image>` at the placeholder id, the processor,
    bos/eos/pad ids and generation_config.json. Tensors stream one at a time from `source_of(module)`."""
    name, sub = anyres_parts(model)
    tensors = anyres_tensors(model, name, dtype, source_of)
    tok = resolve_tokenizer(tokenizer, model.special_token_ids[name], model.language_model.cfg.extra_token_ids)
    ids = token_ids(tok) if tok is not None else {}
    config = anyres_config(model, name, str(next(iter(tensors.values())).dtype).removeprefix("torch."), ids)
    files = None if tok is None else lambda out: save_anyres_processor(tok, sub, out)
    return write_hf_dir(directory, tensors, config, max_shard_bytes, files, ids)
