"""Qwen2-VL and Qwen2.5-VL in: a `Qwen2VLForConditionalGeneration` or `Qwen2_5_VLForConditionalGeneration`
checkpoint as a MimoModel whose `images` modality is a native-resolution tower (mimo.models.native_vit) with the
patch merger as its input projection, over an LM with M-RoPE.

mimo writes an image's and a video's rows at one placeholder (the image token); `qwen_vl_inputs` turns
transformers' processor outputs (separate image and video tensors and ids) into mimo's forward arguments.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from mimo.config.schema import LLMConfig, ModalityConfig, ModelConfig, NativeViTConfig
from mimo.hf.config import _act, llm_config_from_hf, model_type
from mimo.hf.files import WeightSource, open_source
from mimo.hf.load import (
    IMAGES,
    LLM_ANCHOR,
    DeviceSpec,
    DTypeSpec,
    ShardFn,
    Source,
    find_prefix,
    load_hf_weights,
    load_llm_weights,
)
from mimo.hf.placement import empty_module, is_meta, resolve_dtype
from mimo.models.llm import DecoderLM
from mimo.models.mrope import mrope_positions
from mimo.models.multimodal import MimoModel, ModalitySubmodules
from mimo.models.native_vit import NativeVisionTower, PatchMerger

QWEN_VL_TYPES = ("qwen2_vl", "qwen2_5_vl")
TOWER_ANCHOR = "patch_embed.proj.weight"
DEFAULT_MROPE_SECTION = [16, 24, 24]  # transformers' default when rope_parameters has none


def native_vit_config_from_hf(v: dict[str, Any], family: str, where: str) -> tuple[NativeViTConfig, int]:
    """(the tower's config, the merger's output width) of a Qwen2-VL or Qwen2.5-VL vision_config."""
    theta = float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    common = dict(family=family, patch=v["patch_size"], temporal_patch=v["temporal_patch_size"],
                  merge=v["spatial_merge_size"], channels=v.get("in_channels", 3), layers=v["depth"],
                  heads=v["num_heads"], rope_theta=theta, act=_act(v["hidden_act"], f"{where} vision hidden_act"))
    if family == "qwen2_vl":
        hidden = v["embed_dim"]
        cfg = NativeViTConfig(**common, hidden=hidden, mlp=int(hidden * v["mlp_ratio"]), window=0)
        return cfg, v["hidden_size"]
    cfg = NativeViTConfig(**common, hidden=v["hidden_size"], mlp=v["intermediate_size"], window=v["window_size"],
                          full_attention_layers=list(v["fullatt_block_indexes"]),
                          tokens_per_second=float(v.get("tokens_per_second", 4)))
    return cfg, v["out_hidden_size"]


def qwen_vl_llm_config(d: dict[str, Any], where: str) -> LLMConfig:
    """The text half: a Qwen2 decoder whose RoPE is M-RoPE (rope_parameters' mrope_section)."""
    text = d.get("text_config") or d
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    section = list(params.pop("mrope_section", DEFAULT_MROPE_SECTION))
    if params.get("rope_type", params.get("type")) == "mrope":
        params["rope_type"] = "default"
    params.pop("type", None)
    plain = {**text, "model_type": "qwen2", "rope_parameters": params, "rope_scaling": None,
             "tie_word_embeddings": d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))}
    llm = llm_config_from_hf(plain, where)
    if sum(section) != llm.attention_head_dim // 2:
        raise ValueError(f"{where}: mrope_section {section} must sum to head_dim / 2 = {llm.attention_head_dim // 2}")
    llm.mrope_section = section
    return llm


def checkpoint_token_ids(d: dict[str, Any], vocab: int) -> dict[str, int]:
    """The `native` table's token ids of a Qwen-VL config: its video placeholder and its vision markers (-1 where
    it has none; a marker outside the LM's vocabulary, as in tiny test checkpoints that keep Qwen's defaults,
    cannot be an input and counts as none)."""
    start, end = (int(d.get(k, -1)) for k in ("vision_start_token_id", "vision_end_token_id"))
    if not (0 <= start < vocab and 0 <= end < vocab):
        start = end = -1
    return {"video_token_id": int(d.get("video_token_id", -1)), "vision_start_token_id": start,
            "vision_end_token_id": end}


def qwen_vl_model_config(d: dict[str, Any], where: str) -> ModelConfig:
    """mimo's ModelConfig of a Qwen2-VL / Qwen2.5-VL config: one `native_vision` modality named `images`."""
    family = model_type(d, QWEN_VL_TYPES, where)
    llm = qwen_vl_llm_config(d, where)
    native, out = native_vit_config_from_hf(d["vision_config"], family, where)
    if out != llm.hidden:
        raise ValueError(f"{where}: the patch merger gives {out} features but the LM's hidden size is {llm.hidden}")
    native = replace(native, **checkpoint_token_ids(d, llm.vocab))
    images = ModalityConfig(kind="native_vision", token_id=int(d["image_token_id"]), native=native)
    return ModelConfig(llm=llm, modalities={IMAGES: images})


def load_native_vision_weights(sub: ModalitySubmodules, src: WeightSource, tower_shard: ShardFn | None = None,
                               merger_shard: ShardFn | None = None) -> None:
    """The tower (`visual.*` minus the merger) and the merger (the input projection) of a Qwen-VL checkpoint; the
    shard functions (mimo.hf.load) read each rank's pieces."""
    prefix = find_prefix(src, TOWER_ANCHOR, "Qwen-VL vision tower")
    tower, merger = sub.encoders["visual"], sub.input_projections[0]
    load_hf_weights(tower, src, {n: prefix + n for n in tower.state_dict()}, tower_shard)
    load_hf_weights(merger, src, {n: f"{prefix}merger.{n}" for n in merger.state_dict()}, merger_shard)


def import_qwen2_vl(source: Source, dtype: DTypeSpec = "auto",
                    device: DeviceSpec = "cpu") -> tuple[ModelConfig, MimoModel]:
    """A Qwen2-VL or Qwen2.5-VL checkpoint (directory or live `transformers` model) as (its ModelConfig, a
    MimoModel), in the checkpoint's dtype or `dtype`, on `device` (meta: shapes only). Encoder inputs:
    `{"visual": {"pixel_values": [N, C*T*P*P], "grid_thw": [n, 3]}}`, items in placeholder order (see
    `qwen_vl_inputs`); position ids `[B, S, 3]` (mimo.models.mrope)."""
    with open_source(source) as src:
        where = f"'{src.config_label}'"
        cfg = qwen_vl_model_config(src.config(), where)
        images = cfg.modalities[IMAGES]
        dt = resolve_dtype(dtype, src, find_prefix(src, LLM_ANCHOR, "language model") + LLM_ANCHOR)
        lm = empty_module(lambda: DecoderLM(cfg.llm), dt, device)
        tower = empty_module(lambda: NativeVisionTower(images.native), dt, device)
        merger = empty_module(lambda: PatchMerger(images.native, cfg.llm.hidden, cfg.llm.init_std), dt, device)
        sub = ModalitySubmodules(encoders={"visual": tower}, input_projections=[merger])
        if not is_meta(device):
            load_llm_weights(lm, src)
            load_native_vision_weights(sub, src)
    return cfg, MimoModel(lm, {IMAGES: sub}, {IMAGES: images.token_id}).eval()


def _items_in_order(input_ids: torch.Tensor, image: int, video: int) -> list[int]:
    """The kind (image or video id) of each run of placeholders, batch-major: the order mimo's rows take."""
    kinds = []
    for row in input_ids.tolist():
        for s, tok in enumerate(row):
            if tok in (image, video) and (s == 0 or row[s - 1] != tok):
                kinds.append(tok)
    return kinds


def qwen_vl_inputs(cfg: ModelConfig, input_ids: torch.Tensor, pixel_values: torch.Tensor | None = None,
                   image_grid_thw: torch.Tensor | None = None, pixel_values_videos: torch.Tensor | None = None,
                   video_grid_thw: torch.Tensor | None = None, second_per_grid_ts: torch.Tensor | None = None,
                   attention_mask: torch.Tensor | None = None) -> dict[str, Any]:
    """transformers' Qwen-VL processor outputs -> mimo's forward keywords (`input_ids` with video placeholders
    turned into the image placeholder, `position_ids` `[B, S, 3]` as transformers' get_rope_index gives them,
    `modality_inputs` with every item's patches in placeholder order). Each run of placeholders is one item."""
    m = cfg.modalities[IMAGES]
    native, image = m.native, m.token_id
    video = native.video_token_id
    pixels = {image: list(torch.split(pixel_values, (image_grid_thw.prod(-1)).tolist())) if pixel_values is not None
              else [], video: list(torch.split(pixel_values_videos, (video_grid_thw.prod(-1)).tolist()))
              if pixel_values_videos is not None else []}
    grids = {image: list(image_grid_thw) if image_grid_thw is not None else [],
             video: list(video_grid_thw) if video_grid_thw is not None else []}
    seconds = list(second_per_grid_ts.tolist()) if second_per_grid_ts is not None else [1.0] * len(grids[video])
    rows, thw, steps = [], [], []
    for kind in _items_in_order(input_ids, image, video):
        rows.append(pixels[kind].pop(0))
        thw.append(grids[kind].pop(0))
        step = native.tokens_per_second * seconds.pop(0) if kind == video and native.family == "qwen2_5_vl" else 1.0
        steps.append(step)
    ids = torch.where(input_ids == video, torch.full_like(input_ids, image), input_ids) if video >= 0 else input_ids
    grid = torch.stack(thw) if thw else torch.zeros(0, 3, dtype=torch.long)
    positions = mrope_positions(ids, image, grid, native.merge, torch.tensor(steps), attention_mask)
    out: dict[str, Any] = {"input_ids": ids, "position_ids": positions}
    if rows:
        out["modality_inputs"] = {IMAGES: {"visual": {"pixel_values": torch.cat(rows), "grid_thw": grid}}}
    return out
