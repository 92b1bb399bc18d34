"""`build_model`: a MimoModel from a config, with the weights of its Hugging Face directories (`hf_path`
fields) loaded; a config without them goes straight to the pure builder (mimo.models.build).

The directories are the truth for architecture: their config.json overwrites the LM's and each vision
tower's architecture fields in the run's config (so the saved config.toml records the real shapes), the
model is built, and the weights stream in. Projectors (and anything without an hf_path) keep their random
initialisation: the LLaVA recipe of training the projector first; a Qwen2-VL / Qwen2.5-VL directory as the LM's
and a native_vision modality's hf_path gives its LM, and its tower with its patch merger (the projection).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import torch
from torch import nn

from mimo.config.schema import ConfigError, LLMConfig, ModelConfig
from mimo.hf.config import llm_config_from_hf, model_type, vit_config_from_hf
from mimo.hf.files import DirectorySource, TensorSlice
from mimo.hf.load import ShardFn, load_llm_weights, load_vit_weights
from mimo.hf.qwen2_vl import (
    QWEN_VL_TYPES,
    checkpoint_token_ids,
    load_native_vision_weights,
    native_vit_config_from_hf,
    qwen_vl_llm_config,
)
from mimo.models.build import build_model as build_plain_model
from mimo.models.init import INIT_SPECS, LocalView, is_on_meta, whole
from mimo.models.multimodal import MimoModel


def _config_of(path: str, field: str) -> dict:
    try:
        return DirectorySource(path).config()
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{field} = '{path}': {e}") from e


def resolve_hf_architecture(cfg: ModelConfig) -> None:
    """Overwrite architecture fields in `cfg` from the config.json of every hf_path; check placeholder ids."""
    if cfg.llm.hf_path:
        d = _config_of(cfg.llm.hf_path, "model.llm.hf_path")
        where = f"model.llm.hf_path '{cfg.llm.hf_path}'"
        if d.get("model_type") in QWEN_VL_TYPES:
            llm = qwen_vl_llm_config(d, where)
            extra = cfg.llm.extra_tokens
            cfg.llm = replace(llm, init_std=cfg.llm.init_std, hf_path=cfg.llm.hf_path, extra_tokens=extra,
                              vocab=llm.vocab + len(extra))
        else:
            d = d.get("text_config", d) if d.get("model_type") == "llava" else d
            cfg.llm = llm_config_from_hf(d, where, base=cfg.llm)
    for name, m in cfg.modalities.items():
        field = f"model.modalities.{name}.hf_path"
        if m.hf_path and m.kind == "native_vision":
            d = _config_of(m.hf_path, field)
            family = model_type(d, QWEN_VL_TYPES, f"{field} '{m.hf_path}'")
            native, _ = native_vit_config_from_hf(d["vision_config"], family, f"{field} '{m.hf_path}'")
            m.native = replace(native, init_std=m.native.init_std, min_pixels=m.native.min_pixels,
                               max_pixels=m.native.max_pixels, **checkpoint_token_ids(d, cfg.llm.vocab))
        elif m.hf_path:
            if m.kind != "vision":
                raise ConfigError(f"{field} is set but kind = '{m.kind}'; Hugging Face towers load for vision and "
                                  "native_vision (a Qwen2-VL / Qwen2.5-VL directory) only")
            d = _config_of(m.hf_path, field)
            d = d["vision_config"] if d.get("model_type") == "llava" else d
            m.vit = vit_config_from_hf(d, f"{field} '{m.hf_path}'", m.hf_feature_layer, base=m.vit)
        if not 0 <= m.token_id < cfg.llm.vocab:
            raise ConfigError(f"model.modalities.{name}.token_id ({m.token_id}) must lie in [0, {cfg.llm.vocab}), "
                              "the vocabulary of model.llm.hf_path and model.llm.extra_tokens"
                              + extra_tokens_fix(cfg.llm))


def extra_tokens_fix(llm: LLMConfig) -> str:
    """How to give a placeholder a new id: one more entry in model.llm.extra_tokens and its id (a resolved llm)."""
    tokens = [*llm.extra_tokens, "<image>" if "<image>" not in llm.extra_tokens else "<image_1>"]
    return (f"; for a new placeholder token set model.llm.extra_tokens = "
            f"{json.dumps(tokens)} and token_id = {llm.vocab}")


def view_shard_fn(module: nn.Module, prefix: str, view: LocalView) -> ShardFn:
    """A `shard_fn` reading, for each parameter of `module` (called `prefix` + its name in the MimoModel),
    exactly the piece `view` says this rank holds (mimo.parallel.materialize): TP slices, FSDP shards."""
    params = dict(module.named_parameters())

    def shard(name: str, sl: TensorSlice) -> torch.Tensor:
        index, target = view(prefix + name, params[name])
        if not target.numel():
            return torch.empty(target.shape, dtype=target.dtype)
        return sl[index] if index else sl[:]

    return shard


def load_hf_weights_into(model: MimoModel, cfg: ModelConfig, view: LocalView = whole) -> None:
    """Stream the weights of every hf_path into the built (possibly laid-out) model, each rank reading only the
    pieces `view` names (default: every tensor whole, read straight into the parameter). Not collective."""
    if cfg.llm.hf_path and any(True for _ in model.language_model.parameters()):
        with DirectorySource(cfg.llm.hf_path) as src:
            lm = model.language_model
            load_llm_weights(lm, src, None if view is whole else view_shard_fn(lm, "language_model.", view),
                             new_rows_seed=new_rows_seed(model))
    for name, m in cfg.modalities.items():
        if m.hf_path and m.kind == "native_vision":
            load_native_hf_weights(model, name, m.hf_path, view)
            continue
        vit = model.modality_submodules[name].encoders["vit"] if m.hf_path else None
        if vit is not None and any(True for _ in vit.parameters()):
            with DirectorySource(m.hf_path) as src:
                shard = view_shard_fn(vit, f"modality_submodules.{name}.encoders.vit.", view)
                load_vit_weights(vit, src, None if view is whole else shard)


def new_rows_seed(model: MimoModel) -> int:
    """The seed of the rows model.llm.extra_tokens add (mimo.hf.grow): the LM embedding's initialisation seed,
    recorded by the builder before any layout, so every rank draws the same rows; 0 for a model built elsewhere."""
    spec = getattr(model, INIT_SPECS, {}).get("language_model.embed_tokens.weight")
    return 0 if spec is None else spec.seed


def load_native_hf_weights(model: MimoModel, name: str, path: str, view: LocalView) -> None:
    """A Qwen-VL directory's tower and merger into modality `name`'s (the pieces `view` names). Not collective."""
    sub = model.modality_submodules[name]
    tower, merger = sub.encoders["visual"], sub.input_projections[0]
    if not any(True for _ in sub.parameters()):
        return
    prefix = f"modality_submodules.{name}."
    with DirectorySource(path) as src:
        shards = (None, None) if view is whole else (view_shard_fn(tower, prefix + "encoders.visual.", view),
                                                     view_shard_fn(merger, prefix + "input_projections.0.", view))
        load_native_vision_weights(sub, src, *shards)


def build_model(cfg: ModelConfig, load_weights: bool = True) -> MimoModel:
    """The full single-device model: seeded from the torch RNG state, then the weights of every hf_path
    loaded (their config.json resolves `cfg`'s architecture fields in place first). On the meta device
    nothing is read: call `load_hf_weights_into` once the model is laid out and materialised."""
    if cfg.llm.hf_path or any(m.hf_path for m in cfg.modalities.values()):
        return build_hf_model(cfg, load_weights)
    return build_plain_model(cfg)


def build_hf_model(cfg: ModelConfig, load_weights: bool = True) -> MimoModel:
    """`build_model` for a config with hf_path fields: resolve `cfg` in place, build, load the weights."""
    resolve_hf_architecture(cfg)
    plain = copy.deepcopy(cfg)
    plain.llm.hf_path = ""
    for m in plain.modalities.values():
        m.hf_path = ""
    model = build_plain_model(plain)
    if load_weights and not is_on_meta(model):  # on meta there is nothing to read into
        load_hf_weights_into(model, cfg)
    return model
