"""Write a MimoModel as a Hugging Face directory: LLaVA (vision tower + projector + LM) or the LM alone.

Weights stream one tensor at a time under Hugging Face names (mimo.export.stream: shards of at most
`max_shard_bytes`, 5 GB by default, with the standard index), from a live model or, for a run
(mimo.export.run), straight out of its sharded DCP checkpoint (mimo.train.checkpoint.tensors), so no process
ever holds the whole model: the peak is the largest tensor. config.json comes from the `transformers` config
classes, so the result loads
with `LlavaForConditionalGeneration` / `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mimo.data.tokenizer import require_transformers, with_extra_tokens
from mimo.export.config import VISION_PREFIXES, hf_act, hf_text_config, hf_vision_config, vision_family_of
from mimo.export.stream import Entry, LiveSource, SourceOf, gather_entries, write_hf_dir
from mimo.export.tokens import (
    run_tokenizer,
    save_llava_processor,
    token_ids,
    with_image_token,
)
from mimo.hf.names import llm_names, projector_names, vit_names, with_prefix
from mimo.models.anyres import AnyResSubmodules
from mimo.models.layers import ACTIVATIONS, MLP
from mimo.models.llm import DecoderLM
from mimo.models.multimodal import MimoModel
from mimo.models.vit import VisionTransformer

TokenizerSpec = str | Path | Any | None


def resolve_tokenizer(tokenizer: TokenizerSpec, image_token_id: int | None,
                      extra_tokens: dict[str, int] | None = None) -> Any:
    """`byte`, a tokenizer directory or a tokenizer object -> a Hugging Face tokenizer (None stays None), with
    model.llm.extra_tokens at their ids ({token: id}) and `<image>` at `image_token_id` when given."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, (str, Path)):
        return run_tokenizer(str(tokenizer), image_token_id, extra_tokens)
    tokenizer = with_extra_tokens(tokenizer, extra_tokens or {}, "the tokenizer")
    return tokenizer if image_token_id is None else with_image_token(tokenizer, image_token_id, "the tokenizer")


def _dtype_name(tensors: dict[str, Entry]) -> str:
    return str(next(iter(tensors.values())).dtype).removeprefix("torch.")


def export_causal_lm(lm: DecoderLM, directory: str | Path, dtype: torch.dtype | None = None,
                     tokenizer: TokenizerSpec = None, source_of: SourceOf = LiveSource,
                     max_shard_bytes: int | None = None) -> Path:
    """The LM alone as a Qwen3/Qwen2/Llama ForCausalLM directory. With `tokenizer` (`byte`, a Hugging Face
    tokenizer directory or object) also its files, bos/eos/pad ids in config.json and generation_config.json.
    Tensors stream one at a time from `source_of(lm)` (default: `lm`'s own)."""
    if lm.embed_tokens is None or lm.norm is None:
        raise ValueError("export_causal_lm needs the whole LM; this one is a pipeline stage without its "
                         "embedding or final norm")
    tok = resolve_tokenizer(tokenizer, None, lm.cfg.extra_token_ids)
    ids = token_ids(tok) if tok is not None else {}
    tensors = gather_entries(lm, llm_names(lm), dtype, source_of)
    config = hf_text_config(lm.cfg, _dtype_name(tensors), ids)
    return write_hf_dir(directory, tensors, config, max_shard_bytes, None if tok is None else tok.save_pretrained, ids)


def act_name(fn: object) -> str:
    return next((k for k, v in ACTIVATIONS.items() if v is fn), repr(fn))


def llava_parts(model: MimoModel) -> tuple[str, VisionTransformer, MLP]:
    """The one vision modality a LLaVA directory can hold: a ViT encoder and one MLP projector."""
    fix = "export the LM alone instead (export_causal_lm / mimo export --lm-only)"
    if len(model.modality_submodules) != 1:
        raise ValueError(f"LLaVA holds exactly one image modality; this model has {list(model.modality_submodules)}"
                         f"; {fix}")
    (name, sub), = model.modality_submodules.items()
    encoders, projs = list(sub.encoders.values()), list(sub.input_projections)
    if (len(encoders) != 1 or not isinstance(encoders[0], VisionTransformer) or len(projs) != 1
            or not isinstance(projs[0], MLP) or len(sub.output_projections) or len(sub.decoders)):
        raise ValueError(f"modality '{name}' must be one VisionTransformer encoder plus one MLP projector (no "
                         f"output path) to become LLaVA; {fix}")
    vit = encoders[0]
    if model.language_model.cfg.logit_softcap:
        raise ValueError("model.llm.logit_softcap (Gemma 2): LlavaForConditionalGeneration never soft-caps its "
                         f"logits, so it would not compute this model; {fix}")
    if vit.cfg.patch_linear:
        raise ValueError(f"model.modalities.{name}.vit.patch_linear = true (SigLIP2) takes patchified pixels, which "
                         "LlavaForConditionalGeneration does not hand its tower; export the tower alone "
                         "(export_vision_tower) and the LM (--lm-only)")
    if vit.post_layernorm is not None:
        raise ValueError(f"model.modalities.{name}.vit.post_norm = true: LLaVA feeds the projector hidden states "
                         "without the tower's final LayerNorm; train with post_norm = false or use --lm-only")
    return name, vit, projs[0]


def unused_tower_tensors(vit: VisionTransformer, dtype: torch.dtype, prefix: str,
                          source_of: SourceOf = LiveSource) -> dict[str, Entry]:
    """What the Hugging Face tower class holds but mimo's tower does not use: the final LayerNorm without
    post_norm (stored as the identity) and DINOv2's mask token (zeros); DINOv2's cls token and positions get
    their leading singleton dims back."""
    h, src = vit.cfg.hidden, source_of(vit)
    norm = "layernorm." if vit.cfg.layer_scale else "post_layernorm."
    made = {}
    if vit.post_layernorm is None:
        made = {f"{prefix}{norm}weight": ((h,), lambda: torch.ones(h)),
                f"{prefix}{norm}bias": ((h,), lambda: torch.zeros(h))}
    if vit.cfg.layer_scale:
        positions = tuple(vit.position_embedding.weight.shape)
        made.update({f"{prefix}embeddings.mask_token": ((1, h), lambda: torch.zeros(1, h)),
                     f"{prefix}embeddings.cls_token": ((1, 1, h), lambda: src.read("class_embedding").reshape(1, 1, h)),
                     f"{prefix}embeddings.position_embeddings": ((1, *positions),
                                                                 lambda: src.read("position_embedding.weight")[None])})
    return {name: Entry(name, shape, dtype, make) for name, (shape, make) in made.items()}


def export_vision_tower(vit: VisionTransformer, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """The tower alone as a CLIPVisionModel, SiglipVisionModel, Siglip2VisionModel or Dinov2Model directory
    (its `last_hidden_state` is mimo's output with post_norm, its `hidden_states[-1]` without)."""
    prefix = VISION_PREFIXES[vision_family_of(vit.cfg, "the vision tower")]
    tensors = gather_entries(vit, with_prefix(vit_names(vit), prefix), dtype)
    tensors.update(unused_tower_tensors(vit, next(iter(tensors.values())).dtype, prefix))
    return write_hf_dir(directory, tensors, hf_vision_config(vit.cfg, "the vision tower", _dtype_name(tensors)))


def export_llava(model: MimoModel, directory: str | Path, dtype: torch.dtype | None = None,
                 tokenizer: TokenizerSpec = None, source_of: SourceOf = LiveSource,
                 max_shard_bytes: int | None = None) -> Path:
    """Vision tower + projector + LM as a `LlavaForConditionalGeneration` directory. With `tokenizer` (`byte`,
    a Hugging Face tokenizer directory or object) also the tokenizer with `<image>` at the placeholder id, a
    processor `AutoProcessor` loads (mimo's pixel preparation), bos/eos/pad ids and generation_config.json.
    Tensors stream one at a time from `source_of(module)` (default: the model's own)."""
    tf = require_transformers()
    name, vit, proj = llava_parts(model)
    if isinstance(model.modality_submodules[name], AnyResSubmodules):
        raise ValueError(f"modality '{name}' tiles anyres images and has a newline row, which LLaVA does not; "
                         "export it with mimo.export.llava_next.export_llava_next (LLaVA-NeXT / OneVision)")
    lm = model.language_model
    tensors = gather_entries(lm, llm_names(lm, "language_model.model.", "language_model."), dtype, source_of)
    tensors.update(gather_entries(vit, with_prefix(vit_names(vit), "vision_tower."), dtype, source_of))
    # The tower's final LayerNorm is unused by LLaVA but expected by the class: store it as the identity.
    tensors.update(unused_tower_tensors(vit, next(iter(tensors.values())).dtype, "vision_tower.", source_of))
    tensors.update(gather_entries(proj, with_prefix(projector_names(proj), "multi_modal_projector."), dtype, source_of))
    dt = _dtype_name(tensors)
    vcfg = vit.cfg
    tok = resolve_tokenizer(tokenizer, model.special_token_ids[name], lm.cfg.extra_token_ids)
    ids = token_ids(tok) if tok is not None else {}
    strategy = "default" if vcfg.drops_first_token else "full"
    config = tf.LlavaConfig(
        vision_config=hf_vision_config(vcfg, f"model.modalities.{name}.vit", dt).to_dict(),
        text_config=hf_text_config(lm.cfg, dt, ids).to_dict(), image_token_index=model.special_token_ids[name],
        image_seq_length=vit.tokens_per_image, vision_feature_layer=-1, vision_feature_select_strategy=strategy,
        projector_hidden_act=hf_act(act_name(proj.act), f"model.modalities.{name}.projector.act"),
        multimodal_projector_bias=proj.fc1.bias is not None, tie_word_embeddings=lm.cfg.tie_embeddings, dtype=dt)
    config.architectures = ["LlavaForConditionalGeneration"]
    files = None if tok is None else lambda out: save_llava_processor(tok, vcfg, strategy, out)
    return write_hf_dir(directory, tensors, config, max_shard_bytes, files, ids)
