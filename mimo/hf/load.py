"""Hugging Face weights into mimo modules: a model directory or a live `transformers` model.

`load_hf_weights(module, source, mapping, shard_fn)` copies one tensor (or one shard of it) at a time and
is the single entry point every importer uses. Under tensor parallelism the module's parameters are
already shards; `shard_fn` receives each parameter's name and the lazy safetensors slice and returns this
rank's piece, so a rank never reads the other ranks' rows. Each importer reads the config, builds the mimo
module with the matching options, finds where the checkpoint keeps the component (the key prefix) and
streams the weights in.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from mimo.config.schema import LLMConfig, ModalityConfig, ModelConfig, ViTConfig
from mimo.hf.config import (
    audio_config_from_hf,
    llm_config_from_hf,
    model_type,
    projector_config_from_hf,
    vit_config_from_hf,
)
from mimo.hf.files import RowsSlice, StackSlice, TensorSlice, WeightSource, open_source
from mimo.hf.grow import GrownRows, GrownSlice
from mimo.hf.names import (
    ExpertStack,
    HFName,
    audio_names,
    llm_names,
    projector_names,
    vit_anchor,
    vit_names,
    with_prefix,
)
from mimo.hf.placement import DeviceSpec, DTypeSpec, empty_module, is_meta, resolve_dtype
from mimo.models.audio import AudioEncoder
from mimo.models.init import parameter_seed
from mimo.models.llm import DecoderLM
from mimo.models.multimodal import MimoModel, ModalitySubmodules
from mimo.models.projector import MLPProjector
from mimo.models.vit import VisionTransformer

ShardFn = Callable[[str, TensorSlice], torch.Tensor]


def load_hf_weights(module: nn.Module, source: str | Path | nn.Module | WeightSource, mapping: Mapping[str, HFName],
                    shard_fn: ShardFn | None = None) -> None:
    """Fill every parameter and persistent buffer of `module` from `source`.

    `mapping` maps each of the module's state-dict names to a tensor name in the source (or rows of one, a
    `Rows` part of a fused tensor); every entry of the module's state dict must be covered. `shard_fn(name,
    tensor_slice)` (default: read the whole tensor) returns the piece for this process, which must match the
    parameter's (possibly sharded) shape.
    """
    targets = module.state_dict(keep_vars=True)
    uncovered = [n for n in targets if n not in mapping]
    if uncovered:
        raise ValueError(f"no Hugging Face tensor is mapped to {uncovered[:5]}{' ...' if len(uncovered) > 5 else ''}"
                         f" of {type(module).__name__}; the mapping does not fit this module's config")
    unknown = [n for n in mapping if n not in targets]
    if unknown:
        raise ValueError(f"the mapping names {unknown[:5]}, which {type(module).__name__} does not have")
    with open_source(source) as src:
        for name, hf in mapping.items():
            target = local_piece(targets[name])
            sl, hf_name, part = hf_slice(src, hf)
            # Without a shard function a whole tensor goes straight into the parameter (no second copy).
            tensor = shard_fn(name, sl) if shard_fn else (sl[:] if part else sl)
            shape = tuple(tensor.shape) if shard_fn or part else tuple(tensor.get_shape())
            if shape != tuple(target.shape) and _squeezed(shape) == tuple(target.shape):
                target = target.view(shape)  # DINOv2's [1, 1, H] cls token and [1, N, H] positions
            if shape != tuple(target.shape):
                what = f"tensor '{hf_name}'" + (f" rows {part[0]}:{part[1]}" if part else "")
                if isinstance(hf, ExpertStack):
                    what = f"the stack of {len(hf.names)} expert tensors from '{hf_name}'"
                raise ValueError(f"{what} in '{src.where(hf_name)}' has shape {shape}, "
                                 f"but mimo's '{name}' needs {tuple(target.shape)}; the checkpoint and the config "
                                 "(or the shard function) disagree")
            with torch.no_grad():
                if shard_fn or part:
                    target.copy_(tensor)
                else:
                    src.read_into(hf_name, target.data)


def local_piece(target: torch.Tensor) -> torch.Tensor:
    """An FSDP2 shard's local piece (a DTensor's `to_local()`, which the load fills), else `target` itself.
    `torch.distributed.tensor` is looked up, not imported: nothing is a DTensor unless that module is loaded, and
    importing it would keep 0.04 GiB resident in every plain (unsharded) import."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return target.to_local() if dtensor is not None and isinstance(target, dtensor.DTensor) else target


def hf_slice(src: WeightSource, hf: HFName) -> tuple[TensorSlice, str, tuple | None]:
    """(the lazy slice, the checkpoint name for messages, the part (rows, or the stack's size) or None: whole)."""
    if isinstance(hf, ExpertStack):
        return StackSlice([src.get_slice(n) for n in hf.names]), hf.names[0], (0, len(hf.names))
    if isinstance(hf, GrownRows):
        return GrownSlice(src.get_slice(hf.name), hf.rows, hf.seed, hf.head), hf.name, (0, hf.rows)
    if isinstance(hf, str):
        return src.get_slice(hf), hf, None
    return RowsSlice(src.get_slice(hf[0]), *hf[1:]), hf[0], hf[1:]


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` without its leading singleton dimensions."""
    while shape and shape[0] == 1 and len(shape) > 1:
        shape = shape[1:]
    return shape


def dim_shard_fn(dim_of: Callable[[str], int | None], rank: int, world: int) -> ShardFn:
    """A `shard_fn` for even tensor-parallel splits: `dim_of(name)` gives the split dimension of a parameter
    (None = replicated); rank `rank` of `world` reads only its contiguous block along it."""

    def shard(name: str, sl: TensorSlice) -> torch.Tensor:
        dim = dim_of(name)
        if dim is None:
            return sl[:]
        size = sl.get_shape()[dim]
        if size % world:
            raise ValueError(f"'{name}' has {size} entries along dim {dim}, not divisible by {world} ranks")
        step = size // world
        index = (slice(None),) * dim + (slice(rank * step, (rank + 1) * step),)
        return sl[index]

    return shard


def find_prefix(source: WeightSource, anchor: str, what: str) -> str:
    """The key prefix under which `source` stores a component, found from one tensor it must have.

    Checkpoints nest the same weights differently ("model.", "language_model.model.", "vision_tower.",
    "vision_model.", ...); searching for the anchor tensor makes every layout work.
    """
    hits = sorted(k[: -len(anchor)] for k in source.keys()
                  if k == anchor or k.endswith("." + anchor))
    if not hits:
        raise ValueError(f"no tensor named '*{anchor}' in '{source.label}': it holds no {what}")
    if len(hits) > 1:
        raise ValueError(f"'{source.label}' holds several {what}s (prefixes {hits}); pass prefix= to choose one")
    return hits[0]


Source = str | Path | nn.Module | WeightSource
IMAGES = "images"
LLM_ANCHOR = "embed_tokens.weight"


def _where(src: WeightSource) -> str:
    return f"'{src.config_label}'"


def load_llm_weights(lm: DecoderLM, src: WeightSource, shard_fn: ShardFn | None = None,
                     prefix: str | None = None, new_rows_seed: int = 0) -> None:
    """Stream a Qwen2/Qwen3/Llama checkpoint into `lm` (which may be a pipeline stage or TP-sharded). With
    `lm.cfg.extra_tokens` the embedding and an untied head have rows beyond the checkpoint's: they are drawn as
    transformers' mean resizing does (mimo.hf.grow), from `new_rows_seed` and the parameter's name."""
    body = find_prefix(src, "embed_tokens.weight", "language model") if prefix is None else prefix
    head = ""
    if lm.lm_head is not None:
        head = find_prefix(src, "lm_head.weight", "language-model head")
    names = llm_names(lm, body, head)
    if lm.cfg.extra_tokens:
        for name in ("embed_tokens.weight", "lm_head.weight"):
            if name in names:
                names[name] = GrownRows(names[name], lm.cfg.vocab, parameter_seed(new_rows_seed, name),
                                        head=name == "lm_head.weight")
    load_hf_weights(lm, src, names, shard_fn)


def import_llm(source: Source, shard_fn: ShardFn | None = None, base: LLMConfig | None = None,
               dtype: DTypeSpec = "auto", device: DeviceSpec = "cpu") -> DecoderLM:
    """A Qwen2, Qwen3 or Llama causal LM (or the language model inside a LLaVA checkpoint), in the
    checkpoint's dtype (`"auto"`) or `dtype`, on `device` (on meta: the shapes only, nothing is read)."""
    with open_source(source) as src:
        d = src.config()
        d = d.get("text_config", d) if d.get("model_type") == "llava" else d
        cfg = llm_config_from_hf(d, _where(src), base)
        anchor = find_prefix(src, LLM_ANCHOR, "language model") + LLM_ANCHOR
        lm = empty_module(lambda: DecoderLM(cfg), resolve_dtype(dtype, src, anchor), device)
        if not is_meta(device):
            load_llm_weights(lm, src, shard_fn)
    return lm.eval()


def load_vit_weights(vit: VisionTransformer, src: WeightSource, shard_fn: ShardFn | None = None) -> None:
    """Stream a CLIP/SigLIP vision tower into `vit`; blocks beyond `vit`'s layer count are not read."""
    prefix = find_prefix(src, vit_anchor(vit.cfg), "vision tower")
    load_hf_weights(vit, src, with_prefix(vit_names(vit), prefix), shard_fn)


def import_vision(source: Source, feature_layer: int = -1, post_norm: bool = False, drop_class_token: bool = False,
                  shard_fn: ShardFn | None = None, dtype: DTypeSpec = "auto",
                  device: DeviceSpec = "cpu") -> VisionTransformer:
    """A CLIP or SigLIP vision tower (vision model, full CLIP/SigLIP model, or LLaVA checkpoint).

    `feature_layer` keeps the blocks up to LLaVA's `hidden_states[feature_layer]`. `post_norm=True` applies
    the tower's final LayerNorm to every token, as SigLIP's `last_hidden_state` does; CLIP's
    `last_hidden_state` has no final norm. `dtype` and `device` as for `import_llm`.
    """
    with open_source(source) as src:
        d = src.config()
        d = d["vision_config"] if d.get("model_type") == "llava" else d
        cfg = vit_config_from_hf(d, _where(src), feature_layer, post_norm, ViTConfig(drop_class_token=drop_class_token))
        anchor = find_prefix(src, vit_anchor(cfg), "vision tower") + vit_anchor(cfg)
        vit = empty_module(lambda: VisionTransformer(cfg), resolve_dtype(dtype, src, anchor), device)
        if not is_meta(device):
            load_vit_weights(vit, src, shard_fn)
    return vit.eval()


def import_audio_encoder(source: Source, shard_fn: ShardFn | None = None, dtype: DTypeSpec = "auto",
                         device: DeviceSpec = "cpu") -> AudioEncoder:
    """The encoder of a Whisper checkpoint (WhisperModel or WhisperForConditionalGeneration); `dtype` and
    `device` as for `import_llm`."""
    with open_source(source) as src:
        cfg = audio_config_from_hf(src.config(), _where(src))
        prefix = find_prefix(src, "conv1.weight", "Whisper encoder")
        enc = empty_module(lambda: AudioEncoder(cfg), resolve_dtype(dtype, src, prefix + "conv1.weight"), device)
        if not is_meta(device):
            load_hf_weights(enc, src, with_prefix(audio_names(enc), prefix), shard_fn)
    return enc.eval()


def llava_model_config(d: dict, where: str, kinds: tuple[str, ...] = ("llava",)) -> ModelConfig:
    """mimo's ModelConfig for a LLaVA config (of model type `kinds`): one `images` modality whose placeholder is
    the image token."""
    model_type(d, kinds, where)
    layer = d.get("vision_feature_layer", -2)
    if not isinstance(layer, int):
        raise ValueError(f"{where}: vision_feature_layer = {layer} concatenates several layers, which mimo's "
                         "vision tower does not do; use a checkpoint with a single feature layer")
    strategy = d.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise ValueError(f"{where}: vision_feature_select_strategy = '{strategy}' is not LLaVA's 'default' or 'full'")
    # "default" drops the tower's first output token: CLIP's class token, SigLIP's first patch.
    drop = strategy == "default"
    vit = vit_config_from_hf(d["vision_config"], where, layer, base=ViTConfig(drop_class_token=drop,
                                                                               drop_first_patch=drop))
    if d["text_config"].get("model_type") == "gemma2":
        raise ValueError(f"{where}: a Gemma 2 text model inside LLaVA: LlavaForConditionalGeneration never applies its "
                         "final_logit_softcapping, so no mimo LM computes what it does; import the LM alone")
    token = d.get("image_token_id", d.get("image_token_index", 32000))
    images = ModalityConfig(kind="vision", token_id=token, vit=vit, projector=projector_config_from_hf(d, where))
    return ModelConfig(llm=llm_config_from_hf(d["text_config"], where), modalities={IMAGES: images})


def llava_parts(src: WeightSource, cfg: ModelConfig, dtype: DTypeSpec, device: DeviceSpec,
                shard_fn: ShardFn | None = None) -> tuple[DecoderLM, VisionTransformer, MLPProjector]:
    """A LLaVA checkpoint's LM, tower and projector, in the checkpoint's dtype (that of its LM's embedding) or
    `dtype`, on `device` (meta: shapes only, nothing read)."""
    images = cfg.modalities[IMAGES]
    dt = resolve_dtype(dtype, src, find_prefix(src, LLM_ANCHOR, "language model") + LLM_ANCHOR)
    lm = empty_module(lambda: DecoderLM(cfg.llm), dt, device)
    vit = empty_module(lambda: VisionTransformer(images.vit), dt, device)
    proj = empty_module(lambda: MLPProjector(images.vit.hidden, cfg.llm.hidden, images.projector), dt, device)
    if not is_meta(device):
        load_llm_weights(lm, src, shard_fn)
        load_vit_weights(vit, src, shard_fn)
        proj_prefix = find_prefix(src, "multi_modal_projector.linear_1.weight", "LLaVA projector")
        load_hf_weights(proj, src, with_prefix(projector_names(proj), proj_prefix + "multi_modal_projector."),
                        shard_fn)
    return lm, vit, proj


def import_llava(source: Source, shard_fn: ShardFn | None = None, dtype: DTypeSpec = "auto",
                 device: DeviceSpec = "cpu") -> tuple[ModelConfig, MimoModel]:
    """A `LlavaForConditionalGeneration` checkpoint as a MimoModel (modality `images`, encoder `vit`), in the
    checkpoint's dtype (that of its LM's embedding) or `dtype`, on `device` (meta: shapes only)."""
    with open_source(source) as src:
        cfg = llava_model_config(src.config(), _where(src))
        lm, vit, proj = llava_parts(src, cfg, dtype, device, shard_fn)
    sub = ModalitySubmodules(encoders={"vit": vit}, input_projections=[proj])
    return cfg, MimoModel(lm, {IMAGES: sub}, {IMAGES: cfg.modalities[IMAGES].token_id}).eval()
