"""Translate Hugging Face config.json dictionaries into mimo's config dataclasses.

Plain dictionaries in, so importing needs no `transformers`. Anything mimo's modules cannot reproduce
(sliding-window attention, an MLP bias, an unknown RoPE type, ...) is refused here, naming the field, rather
than imported into a model that would silently compute something else.
"""

from __future__ import annotations

from typing import Any

from mimo.config.schema import LLAMA3_ROPE_KEYS, AudioConfig, LLMConfig, ProjectorConfig, ViTConfig

LLM_TYPES = ("qwen2", "qwen3", "llama", "mistral", "phi3", "olmo2", "gemma2", "gemma3_text", "qwen2_moe", "qwen3_moe",
             "mixtral")
VISION_TYPES = {"clip_vision_model": "clip", "siglip_vision_model": "siglip", "clip": "clip", "siglip": "siglip",
                "dinov2": "dinov2", "siglip2_vision_model": "siglip2", "siglip2": "siglip2"}
HF_TO_MIMO_ACT = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                  "silu": "silu", "relu": "relu"}


def _act(name: str, where: str) -> str:
    if name not in HF_TO_MIMO_ACT:
        raise ValueError(f"{where} = '{name}' is not an activation mimo has; supported: {list(HF_TO_MIMO_ACT)}")
    return HF_TO_MIMO_ACT[name]


def _refuse(d: dict[str, Any], key: str, ok: Any, where: str, why: str) -> None:
    if d.get(key, ok) not in (ok, None):
        raise ValueError(f"{where}: {key} = {d[key]!r} is not supported ({why})")


NOT_LLAVA = {
    "gemma3": "Gemma 3's VLM lets the image tokens attend to each other both ways and pools the patches in its "
              "projector, which mimo's LLaVA-pattern models do not; import its LM alone from a Gemma3ForCausalLM "
              "checkpoint",
    "paligemma": "PaliGemma attends both ways over the image and the prompt (a prefix LM), which mimo's causal LMs "
                 "do not; import its tower or LM alone",
}
"""VLM families that look like LLaVA (a tower, a projector, an LM) but attend differently: refused with the reason."""


def model_type(d: dict[str, Any], expected: tuple[str, ...] | dict[str, str], where: str) -> str:
    mt = d.get("model_type")
    if mt in NOT_LLAVA and mt not in expected:
        raise ValueError(f"{where} describes model_type '{mt}', which mimo cannot import: {NOT_LLAVA[mt]}")
    if mt not in expected:
        raise ValueError(f"{where} describes model_type '{mt}' (architectures {d.get('architectures')}); "
                         f"expected one of {list(expected)}")
    return mt


def _rope(d: dict[str, Any], where: str) -> tuple[float, dict[str, float]]:
    """(theta, Llama 3 scaling) from either the 5.x `rope_parameters` or the 4.x `rope_theta`/`rope_scaling`."""
    params = dict(d.get("rope_parameters") or {})
    legacy = d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    merged = {**legacy, **params}
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind == "default":
        return theta, {}
    if kind == "llama3":
        return theta, {k: float(merged[k]) for k in LLAMA3_ROPE_KEYS}
    raise ValueError(f"{where}: rope type '{kind}' is not supported; mimo has plain RoPE and Llama 3 scaling")


def llm_config_from_hf(d: dict[str, Any], where: str = "config.json", base: LLMConfig | None = None) -> LLMConfig:
    """A Qwen2/Qwen3/Llama/Mistral/Phi-3/OLMo 2/Gemma 2/Gemma 3 (text) config. `base` supplies the non-architecture
    fields (init_std, hf_path, extra_tokens: the vocabulary grows by as many rows)."""
    mt = model_type(d, LLM_TYPES, where)
    _refuse(d, "hidden_act", "silu", where, "mimo's MLP is SwiGLU with SiLU")
    _refuse(d, "mlp_bias", False, where, "mimo's MLP has no biases")
    _refuse(d, "use_sliding_window", False, where, "mimo has no sliding-window attention")
    if mt in ("mistral", "phi3", "mixtral"):
        _refuse(d, "sliding_window", None, where, "mimo has no sliding-window attention (Mistral checkpoints from "
                "v0.2 on set it to null)")
    if mt == "phi3":
        _refuse({**d, **(d.get("rope_parameters") or {})}, "partial_rotary_factor", 1.0, where,
                "mimo rotates every dimension of a head")
    if mt not in ("qwen2", "qwen2_moe"):
        _refuse(d, "attention_bias", False, where, "an output-projection bias mimo's attention does not have")
    heads = d["num_attention_heads"]
    head_dim = d.get("head_dim") or d["hidden_size"] // heads
    gemma = _gemma(d, where, mt) if mt.startswith("gemma") else {}
    theta, scaling = (gemma.pop("rope_theta"), {}) if gemma else _rope(d, where)
    base = base or LLMConfig()
    qkv_bias = mt == "qwen2" or (mt == "qwen2_moe" and bool(d.get("qkv_bias", True)))
    return LLMConfig(**gemma, **_moe(d, mt, where, base), vocab=d["vocab_size"] + len(base.extra_tokens),
                     hidden=d["hidden_size"],
                     layers=d["num_hidden_layers"], heads=heads, kv_heads=d.get("num_key_value_heads") or heads,
                     mlp=d["intermediate_size"], qkv_bias=qkv_bias,
                     tie_embeddings=bool(d.get("tie_word_embeddings", False)),
                     rope_theta=theta, norm_eps=d.get("rms_norm_eps", 1e-6),
                     max_seq=d.get("max_position_embeddings", base.max_seq), init_std=base.init_std,
                     qk_norm=mt in ("qwen3", "olmo2", "gemma3_text", "qwen3_moe"), qk_norm_full=mt == "olmo2",
                     post_norm=mt == "olmo2",
                     head_dim=0 if head_dim * heads == d["hidden_size"] else head_dim,
                     rope_scaling=scaling, family=mt, hf_path=base.hf_path,
                     extra_tokens=list(base.extra_tokens))


def _moe(d: dict[str, Any], mt: str, where: str, base: LLMConfig) -> dict[str, Any]:
    """The LLMConfig moe_* fields of a Qwen2-MoE, Qwen3-MoE or Mixtral config (none for a dense family); the
    router losses' weights are training settings and come from `base`."""
    if mt not in ("qwen2_moe", "qwen3_moe", "mixtral"):
        return {}
    train = dict(moe_aux_loss_weight=base.moe_aux_loss_weight, moe_z_loss_weight=base.moe_z_loss_weight)
    if mt == "mixtral":
        _refuse(d, "router_jitter_noise", 0.0, where, "mimo's router adds no noise to its inputs")
        return dict(moe_experts=d["num_local_experts"], moe_top_k=d["num_experts_per_tok"],
                    moe_mlp=d["intermediate_size"], moe_norm_topk=True, **train)
    shared = int(d.get("shared_expert_intermediate_size") or 0) if mt == "qwen2_moe" else 0
    return dict(moe_experts=d.get("num_experts") or d.get("num_local_experts"), moe_top_k=d["num_experts_per_tok"],
                moe_mlp=d["moe_intermediate_size"], moe_every=d.get("decoder_sparse_step", 1),
                moe_dense_layers=list(d.get("mlp_only_layers") or []), moe_norm_topk=bool(d.get("norm_topk_prob")),
                moe_shared_mlp=shared, moe_shared_gate=shared > 0, **train)


GEMMA3_LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}


def _gemma(d: dict[str, Any], where: str, mt: str) -> dict[str, Any]:
    """The LLMConfig fields particular to Gemma 2 and Gemma 3's text model (rope_theta included: Gemma 3 has
    one per layer type)."""
    if mt == "gemma3_text":
        _refuse(d, "attn_logit_softcapping", None, where, "Gemma 3's attention has no logit soft-capping")
        _refuse(d, "final_logit_softcapping", None, where, "Gemma 3's LM head has no logit soft-capping")
    _refuse(d, "use_bidirectional_attention", False, where, "mimo's LM is causal")
    _refuse(d, "hidden_activation", "gelu_pytorch_tanh", where, "mimo's Gemma MLP gates with tanh-approximated GELU")
    params = d.get("rope_parameters") or {}
    per_type = "full_attention" in params or "sliding_attention" in params
    thetas = {}
    for kind, default in (("full_attention", d.get("rope_theta", 1e6 if per_type else 1e4)),
                          ("sliding_attention", d.get("rope_local_base_freq", 1e4))):
        p = params.get(kind, {}) if per_type else params
        if p.get("rope_type", "default") != "default":
            raise ValueError(f"{where}: rope type '{p['rope_type']}' is not supported; mimo's Gemma has plain RoPE "
                             "(Gemma 2's, the Gemma 3 1B text model's)")
        thetas[kind] = float(p.get("rope_theta", default))
    types = [GEMMA3_LAYER_TYPES.get(t) for t in d["layer_types"]]
    if None in types:
        raise ValueError(f"{where}: layer_types {d['layer_types']} has a type mimo does not know; expected "
                         f"{list(GEMMA3_LAYER_TYPES)}")
    return dict(sandwich_norm=True, norm_offset=True, embed_scale=True, mlp_act="gelu_tanh",
                query_scale=float(d["query_pre_attn_scalar"]) ** -0.5, sliding_window=int(d["sliding_window"] or 0),
                layer_types=types, rope_theta=thetas["full_attention"],
                rope_local_theta=thetas["sliding_attention"] if per_type else 0.0,
                attn_softcap=float(d.get("attn_logit_softcapping") or 0.0),
                logit_softcap=float(d.get("final_logit_softcapping") or 0.0))


def vision_family(d: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    """("clip" | "siglip" | "siglip2" | "dinov2", the vision sub-config) of a vision-tower or full model config."""
    mt = model_type(d, VISION_TYPES, where)
    return VISION_TYPES[mt], (d["vision_config"] if mt in ("clip", "siglip", "siglip2") else d)


def layers_for_feature_layer(total: int, feature_layer: int, where: str) -> int:
    """How many blocks produce LLaVA's `hidden_states[feature_layer]` (index 0 is the embedding output)."""
    used = total + 1 + feature_layer if feature_layer < 0 else feature_layer
    if not 1 <= used <= total:
        raise ValueError(f"{where}: vision feature layer {feature_layer} selects no block of a {total}-layer tower")
    return used


def vit_config_from_hf(d: dict[str, Any], where: str = "config.json", feature_layer: int = -1,
                       post_norm: bool = False, base: ViTConfig | None = None) -> ViTConfig:
    """A CLIP, SigLIP or DINOv2 vision config; `feature_layer` trims the blocks LLaVA-style. `base` supplies
    drop_class_token, drop_first_patch (kept for SigLIP only: the others drop their class token) and init_std."""
    family, v = vision_family(d, where)
    siglip, dino = family in ("siglip", "siglip2"), family == "dinov2"
    if family == "siglip2":
        side = int(v["num_patches"] ** 0.5)
        if side * side != v["num_patches"]:
            raise ValueError(f"{where}: num_patches = {v['num_patches']} is not a square grid")
        v = {**v, "image_size": side * v["patch_size"]}  # its native grid: positions used as they are
    base = base or ViTConfig()
    layers = layers_for_feature_layer(v["num_hidden_layers"], feature_layer, where)
    if dino:
        _refuse(v, "use_swiglu_ffn", False, where, "mimo's ViT MLP is two linears (DINOv2 giant's SwiGLU is not)")
        _refuse(v, "qkv_bias", True, where, "mimo's ViT attention has q/k/v biases")
        mlp = int(v["hidden_size"] * v.get("mlp_ratio", 4))
    else:
        mlp = v["intermediate_size"]
    return ViTConfig(image=v["image_size"], patch=v["patch_size"], channels=v.get("num_channels", 3),
                     hidden=v["hidden_size"], layers=layers, heads=v["num_attention_heads"], mlp=mlp,
                     act=_act(v.get("hidden_act", "gelu" if dino else "quick_gelu"), f"{where} hidden_act"),
                     norm_eps=v.get("layer_norm_eps", 1e-5 if family == "clip" else 1e-6),
                     drop_class_token=base.drop_class_token, init_std=base.init_std, class_token=not siglip,
                     pre_norm=family == "clip", patch_bias=family != "clip", post_norm=post_norm,
                     drop_first_patch=base.drop_first_patch and siglip, layer_scale=dino,
                     patch_linear=family == "siglip2")


def audio_config_from_hf(d: dict[str, Any], where: str = "config.json") -> AudioConfig:
    """The encoder half of a Whisper config."""
    model_type(d, ("whisper",), where)
    _refuse(d, "scale_embedding", False, where, "mimo's audio encoder does not scale its inputs")
    return AudioConfig(n_mels=d["num_mel_bins"], hidden=d["d_model"], layers=d["encoder_layers"],
                       heads=d["encoder_attention_heads"], mlp=d["encoder_ffn_dim"],
                       max_positions=d["max_source_positions"],
                       act=_act(d.get("activation_function", "gelu"), f"{where} activation_function"))


def projector_config_from_hf(d: dict[str, Any], where: str) -> ProjectorConfig:
    """LLaVA's projector settings."""
    return ProjectorConfig(act=_act(d.get("projector_hidden_act", "gelu"), f"{where} projector_hidden_act"),
                           bias=bool(d.get("multimodal_projector_bias", True)))
