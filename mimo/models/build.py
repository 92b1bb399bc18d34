"""The pure model builder: a config in, a single-device MimoModel out, on whatever device is current
(including meta). Weights depend only on one draw from the torch RNG (the model's base seed) and each
parameter's name (mimo.models.init), so a layout can make any part of them later; Hugging Face weights are
mimo.hf's job."""

from __future__ import annotations

import torch

from mimo.config.schema import ModelConfig
from mimo.models.anyres import AnyResSubmodules
from mimo.models.audio import AudioEncoder
from mimo.models.decoders import build_image_output
from mimo.models.init import INIT_SPECS, draw_base_seed, init_specs, materialize
from mimo.models.llm import DecoderLM
from mimo.models.multimodal import MimoModel, ModalitySubmodules
from mimo.models.native_vit import NativeVisionTower, PatchMerger
from mimo.models.projector import MLPProjector
from mimo.models.vit import VisionTransformer


def build_vision_submodules(vit_cfg, proj_cfg, lm_hidden: int, init_std: float) -> ModalitySubmodules:
    vit = VisionTransformer(vit_cfg)
    proj = MLPProjector(vit_cfg.hidden, lm_hidden, proj_cfg, init_std)
    return ModalitySubmodules(encoders={"vit": vit}, input_projections=[proj])


def build_native_vision_submodules(native_cfg, lm_hidden: int, init_std: float) -> ModalitySubmodules:
    """A Qwen2-VL-style tower ("visual", inputs `pixel_values` `[N, C*T*P*P]` and `grid_thw` `[n, 3]`) and its
    patch merger as the input projection (mimo.models.native_vit)."""
    merger = PatchMerger(native_cfg, lm_hidden, init_std)
    return ModalitySubmodules(encoders={"visual": NativeVisionTower(native_cfg)}, input_projections=[merger])


def build_audio_submodules(audio_cfg, proj_cfg, lm_hidden: int, init_std: float) -> ModalitySubmodules:
    """A Whisper-style encoder ("whisper") and its MLP projector; pass `output_lengths` with the features
    to give clips of different durations their own token counts (see models/sample_rows.py)."""
    encoder = AudioEncoder(audio_cfg)
    proj = MLPProjector(audio_cfg.hidden, lm_hidden, proj_cfg, init_std)
    return ModalitySubmodules(encoders={"whisper": encoder}, input_projections=[proj])


def build_model(cfg: ModelConfig) -> MimoModel:
    """Build the full single-device model from a config without hf_path fields (mimo.hf.build.build_model
    takes those) on the current device. The modules are made on meta and their initialisation rules
    recorded (`model._mimo_init_specs`, full shapes); off meta each parameter is then drawn by name
    (`materialize`). Weights depend only on the torch RNG state (one draw: the base seed)."""
    if cfg.llm.hf_path or any(m.hf_path for m in cfg.modalities.values()):
        raise ValueError("models.build.build_model builds from the config alone; a config with hf_path fields "
                         "goes through mimo.hf.build.build_model, which resolves and loads the weights")
    device = torch.get_default_device()
    base_seed = draw_base_seed()
    with torch.device("meta"):
        model = _build_modules(cfg)
    specs = init_specs(model, base_seed)
    setattr(model, INIT_SPECS, specs)
    if device.type != "meta":
        materialize(model, specs, device)
    return model


def _build_modules(cfg: ModelConfig) -> MimoModel:
    lm = DecoderLM(cfg.llm)
    subs = {}
    for name, m in cfg.modalities.items():
        if m.kind == "audio":
            subs[name] = build_audio_submodules(m.audio, m.projector, cfg.llm.hidden, cfg.llm.init_std)
        elif m.kind == "native_vision":
            subs[name] = build_native_vision_submodules(m.native, cfg.llm.hidden, cfg.llm.init_std)
        else:
            subs[name] = build_vision_submodules(m.vit, m.projector, cfg.llm.hidden, cfg.llm.init_std)
        if m.anyres_grid_pinpoints:
            sub = subs[name]
            subs[name] = AnyResSubmodules(sub.encoders["vit"], sub.input_projections[0], cfg.llm.hidden,
                                          m.anyres_grid_pinpoints, m.anyres_max_tiles)
        if m.output_token_id >= 0:
            projections, decoders = build_image_output(m.decoder, cfg.llm.hidden, cfg.llm.init_std)
            subs[name].output_projections.extend(projections)
            subs[name].decoders.update(decoders)
    model = MimoModel(lm, subs, {name: m.token_id for name, m in cfg.modalities.items()},
                      {name: m.output_token_id for name, m in cfg.modalities.items() if m.output_token_id >= 0})
    apply_freezing(model, cfg)
    return model


def apply_freezing(model: MimoModel, cfg: ModelConfig) -> None:
    """Per-module freezing: frozen parameters get no gradient and no optimizer state."""
    if cfg.freeze_llm:
        model.language_model.requires_grad_(False)
    for name, m in cfg.modalities.items():
        sub = model.modality_submodules[name]
        if m.freeze_encoder:
            sub.encoders.requires_grad_(False)
        if m.freeze_projector:
            sub.input_projections.requires_grad_(False)
