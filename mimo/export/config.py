"""Translate mimo's config dataclasses into `transformers` config objects for export.

The LM becomes its recorded family (model.llm.family: an imported Mistral exports as Mistral) or Qwen3
(qk-norm), Qwen2 (qkv bias) or Llama (neither); the vision tower becomes CLIP
(class token, pre-LayerNorm) or SigLIP (neither, patch bias). Combinations no `transformers` class
computes identically are refused, naming the mimo fields to change.
"""

from __future__ import annotations

from typing import Any

from mimo.config.schema import LLMConfig, ViTConfig
from mimo.data.tokenizer import require_transformers

MIMO_TO_HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "quick_gelu": "quick_gelu", "silu": "silu",
                  "relu": "relu"}


def hf_act(name: str, field: str) -> str:
    if name not in MIMO_TO_HF_ACT:
        raise ValueError(f"{field} = '{name}' has no Hugging Face equivalent; use one of {list(MIMO_TO_HF_ACT)}")
    return MIMO_TO_HF_ACT[name]


# Families that compute the same LM as Llama (no qkv bias, no qk-norm) under another name.
LLAMA_LIKE = ("llama", "mistral", "phi3")
# Without a tokenizer the ids are unknown: null, never a config class's defaults (Phi-3's pad id 32000 would not
# even fit a small vocabulary).
NO_TOKEN_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
FAMILY_CLASSES = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                  "llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
                  "phi3": ("Phi3Config", "Phi3ForCausalLM"), "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
                  "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
                  "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
                  "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
                  "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
                  "mixtral": ("MixtralConfig", "MixtralForCausalLM")}
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")


def moe_architecture(cfg: LLMConfig) -> str:
    """The MoE family that computes this LM: Qwen3-MoE (qk-norm, no shared expert), Qwen2-MoE (qkv bias, a gated
    shared expert) or Mixtral (neither, every layer MoE, renormalised top-k); otherwise a ValueError naming the
    fields."""
    if cfg.moe_gating != "softmax":
        raise ValueError("model.llm.moe_gating = 'sigmoid' has no Hugging Face family among Qwen2-MoE, Qwen3-MoE and "
                         "Mixtral (all softmax routers); it cannot be exported")
    if cfg.qk_norm and not cfg.qkv_bias and not cfg.moe_shared_mlp:
        return "qwen3_moe"
    if cfg.qkv_bias and not cfg.qk_norm and cfg.moe_shared_mlp and cfg.moe_shared_gate:
        return "qwen2_moe"
    dense = cfg.moe_every != 1 or cfg.moe_dense_layers
    if not (cfg.qk_norm or cfg.qkv_bias or cfg.moe_shared_mlp or dense) and cfg.moe_norm_topk:
        return "mixtral"
    raise ValueError("model.llm.moe_* with qk_norm / qkv_bias: Qwen3-MoE has qk_norm and no shared expert, Qwen2-MoE "
                     "qkv_bias and a gated shared expert (moe_shared_mlp, moe_shared_gate), Mixtral neither, MoE on "
                     "every layer and moe_norm_topk = true; no Hugging Face class computes another mix")


def moe_fields(cfg: LLMConfig, arch: str) -> dict[str, Any]:
    """The MoE family's own config fields."""
    if arch == "mixtral":
        return {"num_local_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
                "intermediate_size": cfg.moe_mlp, "sliding_window": None, "router_jitter_noise": 0.0}
    out = {"num_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k, "moe_intermediate_size": cfg.moe_mlp,
           "decoder_sparse_step": cfg.moe_every, "mlp_only_layers": list(cfg.moe_dense_layers),
           "norm_topk_prob": cfg.moe_norm_topk}
    if arch == "qwen2_moe":
        out.update(shared_expert_intermediate_size=cfg.moe_shared_mlp, qkv_bias=True, use_sliding_window=False)
    return out


def text_architecture(cfg: LLMConfig) -> str:
    """The `transformers` family that computes exactly what this LM does: `model.llm.family` when set (checked
    against the fields), else 'qwen3' (qk-norm), 'qwen2' (qkv bias) or 'llama' (neither)."""
    olmo2 = (cfg.post_norm, cfg.qk_norm_full)
    gemma = (cfg.sandwich_norm, cfg.norm_offset, cfg.embed_scale, cfg.mlp_act != "silu", bool(cfg.query_scale),
             bool(cfg.sliding_window or cfg.layer_types or cfg.rope_local_theta),
             bool(cfg.attn_softcap or cfg.logit_softcap))
    if cfg.moe_experts:
        if any(gemma) or any(olmo2):
            raise ValueError("model.llm.moe_experts with Gemma's or OLMo 2's norms has no Hugging Face class; export "
                             "takes Qwen2-MoE, Qwen3-MoE or Mixtral")
        implied = moe_architecture(cfg)
    elif any(gemma):
        gemma2 = not cfg.qk_norm and not cfg.rope_local_theta
        if not (all(gemma[:3]) and cfg.mlp_act == "gelu_tanh" and not cfg.qkv_bias and not any(olmo2)
                and (gemma2 or not (cfg.attn_softcap or cfg.logit_softcap))):
            raise ValueError("model.llm.sandwich_norm / norm_offset / embed_scale / mlp_act / query_scale / "
                             "sliding_window / softcaps are Gemma's: the first three with mlp_act = 'gelu_tanh' and "
                             "no qkv_bias; Gemma 3 adds qk_norm (and rope_local_theta), Gemma 2 the softcaps; no "
                             "Hugging Face class computes another mix of them")
        implied = "gemma2" if gemma2 else "gemma3_text"
    elif any(olmo2):
        if not (all(olmo2) and cfg.qk_norm and not cfg.qkv_bias):
            raise ValueError("model.llm.post_norm / qk_norm_full are OLMo 2's, which has both with qk_norm and no "
                             "qkv_bias; no Hugging Face class computes another mix of them")
        implied = "olmo2"
    elif cfg.qk_norm:
        if cfg.qkv_bias:
            raise ValueError("model.llm.qk_norm with model.llm.qkv_bias has no Hugging Face counterpart (Qwen3's "
                             "attention_bias also adds an output bias); set one of them to false")
        implied = "qwen3"
    else:
        implied = "qwen2" if cfg.qkv_bias else "llama"
    if not cfg.family:
        return implied
    if cfg.family not in FAMILY_CLASSES:
        raise ValueError(f"model.llm.family = '{cfg.family}' is not one mimo exports; use one of "
                         f"{list(FAMILY_CLASSES)} or '' (implied by the fields)")
    if cfg.family != implied and not (implied == "llama" and cfg.family in LLAMA_LIKE):
        if cfg.moe_experts or cfg.family in MOE_FAMILIES:
            raise ValueError(f"model.llm.family = '{cfg.family}' does not compute this LM (its moe_* / qkv_bias / "
                             f"qk_norm make it '{implied}'); set model.llm.family = '{implied}' or ''")
        raise ValueError(f"model.llm.family = '{cfg.family}' does not compute this LM (its qkv_bias / qk_norm "
                         f"make it '{implied}'); set model.llm.family = '{implied}' or ''")
    if cfg.family in ("phi3", "olmo2") and cfg.attention_head_dim * cfg.heads != cfg.hidden:
        raise ValueError(f"model.llm.family = '{cfg.family}' needs head_dim * heads = hidden (it has no head_dim); "
                         f"got {cfg.attention_head_dim} * {cfg.heads} != {cfg.hidden}")
    return cfg.family


def hf_text_config(cfg: LLMConfig, dtype: str, token_ids: dict[str, int | None] | None = None) -> Any:
    """The `transformers` config of the LM's family; `token_ids` (bos/eos/pad_token_id) go into it (null
    without)."""
    tf = require_transformers()
    arch = text_architecture(cfg)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, **cfg.rope_scaling,
                "original_max_position_embeddings": int(cfg.rope_scaling["original_max_position_embeddings"])}
    config_class, model_class = FAMILY_CLASSES[arch]
    extra = {"sliding_window": None} if arch in ("mistral", "phi3") else {}
    if arch.startswith("gemma"):
        extra, rope = gemma_fields(cfg, arch), None
    if arch in MOE_FAMILIES:
        extra = moe_fields(cfg, arch)
    fields = dict(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.mlp, num_hidden_layers=cfg.layers,
                  num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.attention_head_dim,
                  max_position_embeddings=cfg.max_seq, rms_norm_eps=cfg.norm_eps,
                  tie_word_embeddings=cfg.tie_embeddings, dtype=dtype, **({"rope_parameters": rope} if rope else {}))
    out = getattr(tf, config_class)(**{**fields, **extra, **(token_ids or NO_TOKEN_IDS)})
    out.architectures = [model_class]
    return out


VISION_FAMILIES = {(True, True, False, False, False): "clip", (False, False, True, False, False): "siglip",
                   (False, False, True, False, True): "siglip2", (True, False, True, True, False): "dinov2"}
# Where each tower class keeps its weights in its own directory.
VISION_PREFIXES = {"clip": "vision_model.", "siglip": "vision_model.", "siglip2": "vision_model.", "dinov2": ""}
VISION_CLASSES = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel", "siglip2": "Siglip2VisionModel",
                  "dinov2": "Dinov2Model"}


def gemma_fields(cfg: LLMConfig, arch: str) -> dict[str, Any]:
    """Gemma2Config's / Gemma3TextConfig's own fields: activation, query scale, the layer types with their window
    and RoPE, Gemma 2's softcaps."""
    scalar = 1.0 / cfg.query_scale**2 if cfg.query_scale else float(cfg.attention_head_dim)
    types = cfg.layer_types or ["full"] * cfg.layers
    out = {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": round(scalar) if
           abs(scalar - round(scalar)) < 1e-6 else scalar, "sliding_window": cfg.sliding_window or None,
           "layer_types": [f"{t}_attention" for t in types], "attn_logit_softcapping": cfg.attn_softcap or None,
           "final_logit_softcapping": cfg.logit_softcap or None}
    if arch == "gemma2":
        return {**out, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}}
    local = cfg.rope_local_theta or cfg.rope_theta
    return {**out, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": local}}}


def vision_family_of(cfg: ViTConfig, field: str) -> str:
    flags = (cfg.class_token, cfg.pre_norm, cfg.patch_bias, cfg.layer_scale, cfg.patch_linear)
    if flags not in VISION_FAMILIES:
        raise ValueError(f"{field}: (class_token, pre_norm, patch_bias, layer_scale, patch_linear) = {flags} is "
                         "none of CLIP (true, true, false, false, false), SigLIP (false, false, true, false, false), "
                         "SigLIP2 (false, false, true, false, true) or DINOv2 (true, false, true, true, false); no "
                         "Hugging Face vision tower computes it")
    return VISION_FAMILIES[flags]


def hf_vision_config(cfg: ViTConfig, field: str, dtype: str) -> Any:
    tf = require_transformers()
    kw = dict(hidden_size=cfg.hidden, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
              num_channels=cfg.channels, patch_size=cfg.patch, hidden_act=hf_act(cfg.act, f"{field}.act"),
              layer_norm_eps=cfg.norm_eps, dtype=dtype)
    family = vision_family_of(cfg, field)
    if family == "dinov2":
        if cfg.mlp % cfg.hidden:
            raise ValueError(f"{field}.mlp ({cfg.mlp}) must be a multiple of {field}.hidden ({cfg.hidden}): DINOv2 "
                             "gives its MLP width as mlp_ratio x hidden")
        out = tf.Dinov2Config(mlp_ratio=cfg.mlp // cfg.hidden, qkv_bias=True, image_size=cfg.image, **kw)
    elif family == "siglip2":
        out = tf.Siglip2VisionConfig(intermediate_size=cfg.mlp, num_patches=(cfg.image // cfg.patch) ** 2,
                                     vision_use_head=False, **kw)
    elif family == "clip":
        out = tf.CLIPVisionConfig(intermediate_size=cfg.mlp, image_size=cfg.image, **kw)
    else:
        out = tf.SiglipVisionConfig(intermediate_size=cfg.mlp, image_size=cfg.image, vision_use_head=False, **kw)
    out.architectures = [VISION_CLASSES[family]]
    return out
