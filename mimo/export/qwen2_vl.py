"""Write a MimoModel with a native-resolution vision modality as a `Qwen2VLForConditionalGeneration` or
`Qwen2_5_VLForConditionalGeneration` directory (the tower's `family`), streamed one tensor at a time like every
export (mimo.export.stream), from a live model or a run's checkpoint.

Weights take transformers' 5.x names (`model.visual.*`, the merger as `model.visual.merger.*`,
`model.language_model.*`, `lm_head`); the video placeholder is `native.video_token_id` (token_id + 1 if unset), the
vision markers `native.vision_start_token_id` / `vision_end_token_id` (-1 when the model has none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mimo.config.schema import LLMConfig, NativeViTConfig
from mimo.data.native_images import CLIP_MEAN, CLIP_STD
from mimo.data.tokenizer import require_transformers
from mimo.export.config import hf_act, text_architecture
from mimo.export.stream import LiveSource, SourceOf, gather_entries, write_hf_dir
from mimo.export.tokens import (
    BICUBIC,
    byte_tokenizer,
    run_tokenizer,
    token_ids,
    with_token,
    write_video_processor_config,
)
from mimo.hf.names import llm_names
from mimo.models.multimodal import MimoModel
from mimo.models.native_vit import NativeVisionTower, PatchMerger

ARCHITECTURES = {"qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
                 "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration")}
PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}
VISION_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
"""Qwen2-VL's tokenizer names of the native table's vision markers."""


def native_parts(model: MimoModel) -> tuple[str, NativeVisionTower, PatchMerger]:
    """The one native-resolution modality a Qwen-VL directory holds: its tower and merger."""
    if len(model.modality_submodules) != 1:
        raise ValueError(f"a Qwen-VL directory holds one image modality; this model has "
                         f"{list(model.modality_submodules)}")
    (name, sub), = model.modality_submodules.items()
    tower = sub.encoders["visual"] if "visual" in sub.encoders else None
    merger = sub.input_projections[0] if len(sub.input_projections) == 1 else None
    if not isinstance(tower, NativeVisionTower) or not isinstance(merger, PatchMerger) or len(sub.encoders) != 1:
        raise ValueError(f"modality '{name}' must be one native-resolution tower ('visual') and its patch merger "
                         "(kind = 'native_vision') to become Qwen-VL")
    return name, tower, merger


def qwen_vl_text_config(llm: LLMConfig, dtype: str, ids: dict[str, int | None]) -> dict[str, Any]:
    """The text_config of a Qwen-VL config: a Qwen2 decoder with M-RoPE."""
    if text_architecture(llm) != "qwen2" or not llm.mrope_section:
        raise ValueError("model.llm must be a Qwen2 decoder (qkv_bias = true, no qk_norm or Gemma/OLMo options) with "
                         "model.llm.mrope_section set to become a Qwen-VL text model")
    rope = {"rope_type": "default", "rope_theta": llm.rope_theta, "mrope_section": list(llm.mrope_section)}
    return dict(vocab_size=llm.vocab, hidden_size=llm.hidden, intermediate_size=llm.mlp, num_hidden_layers=llm.layers,
                num_attention_heads=llm.heads, num_key_value_heads=llm.kv_heads, rms_norm_eps=llm.norm_eps,
                max_position_embeddings=llm.max_seq, rope_parameters=rope, tie_word_embeddings=llm.tie_embeddings,
                dtype=dtype, **ids)


def qwen_vl_vision_config(v: NativeViTConfig, out: int, field: str) -> dict[str, Any]:
    """The vision_config of either family (field: the modality's `native` table, for errors)."""
    common = dict(depth=v.layers, num_heads=v.heads, patch_size=v.patch, temporal_patch_size=v.temporal_patch,
                  spatial_merge_size=v.merge, in_channels=v.channels, hidden_act=hf_act(v.act, f"{field}.act"),
                  rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})
    if v.family == "qwen2_vl":
        if v.mlp % v.hidden:
            raise ValueError(f"{field}.mlp ({v.mlp}) must be a multiple of {field}.hidden ({v.hidden}): Qwen2-VL's "
                             "config gives its MLP width as mlp_ratio x embed_dim")
        return dict(common, embed_dim=v.hidden, hidden_size=out, mlp_ratio=v.mlp // v.hidden)
    if v.tokens_per_second != int(v.tokens_per_second):
        raise ValueError(f"{field}.tokens_per_second ({v.tokens_per_second}) must be whole for Qwen2.5-VL's config")
    return dict(common, hidden_size=v.hidden, out_hidden_size=out, intermediate_size=v.mlp, window_size=v.window,
                fullatt_block_indexes=list(v.full_attention_layers), tokens_per_second=int(v.tokens_per_second))


def vision_tokens(v: NativeViTConfig, image: int, field: str) -> dict[str, tuple[int, str]]:
    """{Qwen2-VL's token name: (id, the config field that sets it)}: `<|image_pad|>` / `<|video_pad|>` at the
    placeholder ids (`image`, the video's) and `<|vision_start|>` / `<|vision_end|>` at the ids of `v` (the `field`
    table) if it has them. Refuses two names at one id."""
    video = v.video_token_id if v.video_token_id >= 0 else image + 1
    marks = {"<|image_pad|>": (image, f"{field.removesuffix('.native')}.token_id"),
             "<|video_pad|>": (video, f"{field}.video_token_id")}
    marks.update({VISION_TOKENS[k]: (getattr(v, k), f"{field}.{k}") for k in VISION_TOKENS if getattr(v, k) >= 0})
    ids = [i for i, _ in marks.values()]
    if len(set(ids)) != len(ids):
        held = ", ".join(f"{token} {i} ({key})" for token, (i, key) in marks.items())
        raise ValueError(f"Qwen-VL's tokenizer names each vision token at an id of its own; the model has {held}: "
                         f"give each of these fields its own id")
    return marks


def qwen_vl_tokenizer(spec: str, v: NativeViTConfig, image: int, field: str, extra: dict[str, int]) -> Any:
    """The run's tokenizer (`byte` or a Hugging Face directory) with Qwen2-VL's vision tokens at the model's ids
    (vision_tokens), lowest id first, after model.llm.extra_tokens (`extra`, {token: id}); refused where another
    token holds an id (mimo.export.tokens.with_token)."""
    marks = vision_tokens(v, image, field)
    if spec == "byte":
        return byte_tokenizer({i: token for token, (i, _) in marks.items()})
    tok = run_tokenizer(spec, None, extra)
    for token, (token_id, key) in sorted(marks.items(), key=lambda kv: kv[1][0]):
        tok = with_token(tok, token, token_id, f"tokenizer '{spec}'", f"the model's {token}", key)
    return tok


def qwen_vl_image_processor(v: NativeViTConfig) -> Any:
    """Qwen2-VL's image processor as mimo's native data path (mimo.data.native_images): smart_resize within
    [min_pixels, max_pixels] to multiples of patch x merge, bicubic, / 255, CLIP mean and std, the tower's patches."""
    return require_transformers().Qwen2VLImageProcessorPil(
        size={"shortest_edge": v.min_pixels, "longest_edge": v.max_pixels}, patch_size=v.patch,
        temporal_patch_size=v.temporal_patch, merge_size=v.merge, resample=BICUBIC, do_rescale=True,
        rescale_factor=1 / 255, do_normalize=True, image_mean=CLIP_MEAN.tolist(), image_std=CLIP_STD.tolist(),
        do_convert_rgb=True)


def save_qwen_vl_processor(tok: Any, v: NativeViTConfig, directory: Path) -> None:
    """preprocessor_config.json, processor_config.json as `Qwen2VLProcessor` / `Qwen2_5_VLProcessor` saves it
    (write_video_processor_config) and the tokenizer's files (its chat template in chat_template.jinja)."""
    images = qwen_vl_image_processor(v)
    images.save_pretrained(directory)
    write_video_processor_config(directory, PROCESSORS[v.family], images, "Qwen2VLVideoProcessor")
    tok.save_pretrained(directory)


def export_qwen2_vl(model: MimoModel, directory: str | Path, dtype: torch.dtype | None = None,
                    tokenizer: str | None = None, source_of: SourceOf = LiveSource,
                    max_shard_bytes: int | None = None) -> Path:
    """Tower + merger + LM as a Qwen2-VL / Qwen2.5-VL directory that transformers loads with the same logits.
    With `tokenizer` (`byte` or a Hugging Face tokenizer directory) also its files (the vision markers, if any,
    named as Qwen2-VL's tokenizer names them), bos/eos/pad ids, generation_config.json and the Qwen processor
    (save_qwen_vl_processor), whose image processor gives mimo's pixels and grids.
    Tensors stream one at a time from `source_of(module)` (default: the model's own)."""
    require_transformers()
    name, tower, merger = native_parts(model)
    lm, v = model.language_model, tower.cfg
    tensors = gather_entries(lm, llm_names(lm, "model.language_model.", ""), dtype, source_of)
    tensors.update(gather_entries(tower, {n: f"model.visual.{n}" for n in tower.state_dict()}, dtype, source_of))
    tensors.update(gather_entries(merger, {n: f"model.visual.merger.{n}" for n in merger.state_dict()}, dtype,
                                  source_of))
    dt = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    field = f"model.modalities.{name}.native"
    image = model.special_token_ids[name]
    tok = qwen_vl_tokenizer(tokenizer, v, image, field, lm.cfg.extra_token_ids) if tokenizer else None
    ids = token_ids(tok) if tok is not None else {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    files = None if tok is None else lambda out: save_qwen_vl_processor(tok, v, out)
    config = qwen_vl_hf_config(lm.cfg, v, image, dt, ids, field)
    return write_hf_dir(directory, tensors, config, max_shard_bytes, files, ids)


def qwen_vl_hf_config(llm: LLMConfig, v: NativeViTConfig, image: int, dtype: str, ids: dict[str, int | None],
                      field: str) -> Any:
    """The transformers config (Qwen2VLConfig or Qwen2_5_VLConfig, by the tower's `family`) of an LM with M-RoPE
    under a native-resolution tower whose placeholder is `image` (field: the tower's table, for errors)."""
    tf = require_transformers()
    config_class, arch = ARCHITECTURES[v.family]
    config = getattr(tf, config_class)(
        text_config=qwen_vl_text_config(llm, dtype, ids), vision_config=qwen_vl_vision_config(v, llm.hidden, field),
        image_token_id=image, video_token_id=v.video_token_id if v.video_token_id >= 0 else image + 1,
        vision_start_token_id=v.vision_start_token_id, vision_end_token_id=v.vision_end_token_id,
        tie_word_embeddings=llm.tie_embeddings, dtype=dtype)
    config.architectures = [arch]
    return config
