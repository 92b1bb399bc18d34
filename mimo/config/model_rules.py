"""The rules of the model.* tables alone: module names, sizes, heads, MoE, rotary scaling, M-RoPE, native
resolution, anyres tiling and the Out path. Pure (no files, no torch, no layout): `mimo.config.validate`
runs them first, so every rank raises the same `ConfigError` before any collective."""

from __future__ import annotations

from typing import Any

from mimo.config.schema import LANGUAGE, LLAMA3_ROPE_KEYS, Config, ConfigError

SIZE_FIELDS = {
    "model.llm": ("vocab", "hidden", "layers", "heads", "kv_heads", "mlp", "max_seq"),
    "vit": ("image", "patch", "channels", "hidden", "layers", "heads", "mlp"),
    "native": ("patch", "temporal_patch", "merge", "channels", "hidden", "layers", "heads", "mlp", "min_pixels"),
    "audio": ("n_mels", "hidden", "layers", "heads", "mlp", "max_positions"),
    "decoder": ("image", "patch", "channels", "hidden", "layers", "heads", "mlp"),
}
"""Sizes that must be >= 1, per config table (modality tables prefixed with model.modalities.<name>)."""


def require_at_least(key: str, table: Any, fields: tuple[str, ...], low: float, fix: str = "") -> None:
    """Each `table.<field>` >= `low`, else a ConfigError naming `key.<field>`."""
    for name in fields:
        value = getattr(table, name)
        if value < low:
            raise ConfigError(f"{key}.{name} = {value} must be >= {low}{fix}")


def validate_model(cfg: Config) -> None:
    """Module names, sizes, heads, kinds and placeholder ids of model.*."""
    llm = cfg.model.llm
    require_at_least("model.llm", llm, SIZE_FIELDS["model.llm"], 1)
    require_at_least("model.llm", llm, ("head_dim",), 0, " (0 = hidden / heads)")
    if llm.layer_types and len(llm.layer_types) != llm.layers:
        raise ConfigError(f"model.llm.layer_types must name each of the {llm.layers} layers 'sliding' or 'full', got "
                          f"{llm.layer_types}")
    if "sliding" in llm.layer_types and llm.sliding_window <= 0:
        raise ConfigError("model.llm.layer_types has sliding layers but model.llm.sliding_window is not set (> 0)")
    if llm.qk_norm_full and not llm.qk_norm:
        raise ConfigError("model.llm.qk_norm_full = true needs model.llm.qk_norm = true (it says how wide the q/k "
                          "norms are)")
    if not llm.head_dim and llm.hidden % llm.heads:
        raise ConfigError(f"model.llm.hidden ({llm.hidden}) must be divisible by model.llm.heads ({llm.heads})")
    for rule in (validate_mrope, validate_rope_scaling, validate_extra_tokens):
        rule(llm)
    if llm.heads % llm.kv_heads:
        raise ConfigError(f"model.llm.heads ({llm.heads}) must be divisible by model.llm.kv_heads "
                          f"({llm.kv_heads})")
    ids: dict[int, str] = {}
    for name, m in cfg.model.modalities.items():
        key = f"model.modalities.{name}"
        if name == LANGUAGE:
            raise ConfigError(f"{key}: '{LANGUAGE}' is the language model's name among the modules (layouts, "
                              "dtypes, checkpoints); rename the modality, e.g. model.modalities.images")
        if m.kind == "native_vision":
            validate_native_vision(key, m.native, llm)
            validate_vision_markers(key, m, llm)
        require_at_least(f"{key}.vit", m.vit, SIZE_FIELDS["vit"], 1)
        require_at_least(f"{key}.audio", m.audio, SIZE_FIELDS["audio"], 1)
        require_at_least(f"{key}.decoder", m.decoder, SIZE_FIELDS["decoder"], 1)
        validate_anyres(key, m)
        if m.kind == "audio" and (m.audio.hidden % m.audio.heads or m.audio.hidden % 2):
            raise ConfigError(f"{key}.audio.hidden ({m.audio.hidden}) must be even and divisible by audio.heads "
                              f"({m.audio.heads})")
        # Hugging Face towers floor the patch grid (SigLIP-so400m: 384 px, 14 px patches); they are the truth.
        if m.vit.image % m.vit.patch and not m.hf_path:
            raise ConfigError(f"{key}.vit.image ({m.vit.image}) must be divisible by vit.patch ({m.vit.patch})")
        if m.vit.hidden % m.vit.heads:
            raise ConfigError(f"{key}.vit.hidden must be divisible by vit.heads")
        if m.vit.drop_first_patch and m.vit.class_token and not m.hf_path:
            raise ConfigError(f"{key}.vit.drop_first_patch is for towers without a class token; this one has one: "
                              "set vit.drop_class_token to drop it, or vit.class_token = false")
        # With model.llm.hf_path the vocabulary comes from its config.json; the gate checks it after resolving.
        if not 0 <= m.token_id < llm.vocab and not llm.hf_path:
            raise ConfigError(f"{key}.token_id ({m.token_id}) must lie in [0, model.llm.vocab={llm.vocab})")
        if m.token_id in ids:
            raise ConfigError(f"{key}.token_id ({m.token_id}) is already used by '{ids[m.token_id]}'; each "
                              "modality needs its own placeholder id")
        ids[m.token_id] = name
    trained = [n for n, m in cfg.model.modalities.items()
               if not (m.freeze_encoder and m.freeze_projector) or m.output_token_id >= 0]
    if cfg.model.freeze_llm and not trained:
        raise ConfigError("model.freeze_llm = true and every modality's freeze_encoder and freeze_projector are true: "
                          "nothing would train; unfreeze a module (e.g. model.modalities.<m>.freeze_projector = false)")
    validate_out_path(cfg)
    validate_moe(cfg)


def validate_extra_tokens(llm: Any) -> None:
    """model.llm.extra_tokens: distinct non-empty strings, added to the vocabulary of an hf_path checkpoint."""
    tokens = llm.extra_tokens
    if tokens and not llm.hf_path:
        raise ConfigError("model.llm.extra_tokens grows the vocabulary of a pretrained LM (model.llm.hf_path); without "
                          "one, model.llm.vocab sets the vocabulary: raise it and give the placeholder a new id")
    bad = [t for t in tokens if not isinstance(t, str) or not t.strip()]
    if bad:
        raise ConfigError(f"model.llm.extra_tokens holds {bad[0]!r}; each entry is a token's text, e.g. \"<image>\"")
    twice = sorted({t for t in tokens if tokens.count(t) > 1})
    if twice:
        raise ConfigError(f"model.llm.extra_tokens names {twice[0]!r} more than once; list each new token once")


def validate_moe(cfg: Config) -> None:
    """model.llm.moe_*: sizes, the layers they name, the gating and the router losses' weights."""
    llm = cfg.model.llm
    require_at_least("model.llm", llm, ("moe_experts", "moe_shared_mlp"), 0, " (0 = none)")
    require_at_least("model.llm", llm, ("moe_every",), 1)
    require_at_least("model.llm", llm, ("moe_aux_loss_weight", "moe_z_loss_weight", "moe_bias_rate"), 0,
                     " (0 turns it off)")
    if llm.moe_experts == 0 or llm.hf_path:
        return
    if llm.moe_mlp < 1:
        raise ConfigError(f"model.llm.moe_mlp = {llm.moe_mlp}: set each expert's width (>= 1) with "
                          f"model.llm.moe_experts = {llm.moe_experts}")
    if not 1 <= llm.moe_top_k <= llm.moe_experts:
        raise ConfigError(f"model.llm.moe_top_k = {llm.moe_top_k} must lie in [1, model.llm.moe_experts = "
                          f"{llm.moe_experts}]: each token goes to that many distinct experts")
    if llm.moe_bias_rate and llm.moe_gating != "sigmoid":
        raise ConfigError("model.llm.moe_bias_rate moves the sigmoid router's balancing bias: set model.llm.moe_gating "
                          "= \"sigmoid\", or moe_bias_rate = 0")
    if llm.moe_shared_gate and not llm.moe_shared_mlp:
        raise ConfigError("model.llm.moe_shared_gate = true gates the shared expert: set model.llm.moe_shared_mlp "
                          "(its width), or moe_shared_gate = false")
    outside = [i for i in llm.moe_dense_layers if not 0 <= i < llm.layers]
    if outside:
        raise ConfigError(f"model.llm.moe_dense_layers names layers {outside} outside 0..{llm.layers - 1}")
    if not any(llm.is_moe_layer(i) for i in range(llm.layers)):
        raise ConfigError(f"model.llm.moe_experts = {llm.moe_experts} but no layer is a mixture of experts "
                          f"(moe_every = {llm.moe_every}, moe_dense_layers = {llm.moe_dense_layers}, layers = "
                          f"{llm.layers}); lower moe_every or set moe_experts = 0")
    if cfg.perf.loss_rows_only:
        raise ConfigError("perf.loss_rows_only = true runs the LM's last layer on the labelled rows only, which would "
                          "change what the router losses see; set perf.loss_rows_only = false with "
                          "model.llm.moe_experts > 0")


def validate_mrope(llm: Any) -> None:
    """model.llm.mrope_section: three non-negative sizes covering a head's rotary frequencies."""
    half = llm.attention_head_dim // 2
    if llm.mrope_section and not llm.hf_path and (len(llm.mrope_section) != 3 or min(llm.mrope_section) < 0
                              or sum(llm.mrope_section) != half):
        example = [half // 4, half * 3 // 8, half - half // 4 - half * 3 // 8]
        raise ConfigError(f"model.llm.mrope_section = {llm.mrope_section} must be three sizes (temporal, height, "
                          f"width) >= 0 summing to head_dim / 2 = {half}, e.g. {example}; or [] for one-axis RoPE")


def validate_rope_scaling(llm: Any) -> None:
    """model.llm.rope_scaling: empty, or Llama 3's four keys with factors > 0, low_freq_factor below
    high_freq_factor (RoPE blends between them) and original_max_position_embeddings >= 1."""
    scaling = llm.rope_scaling
    if not scaling or llm.hf_path:  # an hf_path's config.json sets it
        return
    if sorted(scaling) != sorted(LLAMA3_ROPE_KEYS):
        raise ConfigError(f"model.llm.rope_scaling has the keys {sorted(scaling)}; Llama 3's RoPE scaling takes "
                          f"exactly {', '.join(LLAMA3_ROPE_KEYS)} (e.g. 8.0, 1.0, 4.0, 8192), or leave it empty for "
                          "plain RoPE")
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    if not (scaling["factor"] > 0 and 0 < low < high and scaling["original_max_position_embeddings"] >= 1):
        raise ConfigError(f"model.llm.rope_scaling = {dict(scaling)} needs factor > 0, 0 < low_freq_factor < "
                          "high_freq_factor and original_max_position_embeddings >= 1 (Llama 3.1: 8.0, 1.0, 4.0, "
                          "8192)")


def validate_anyres(key: str, m: Any) -> None:
    """A modality's anyres tiling: a vision one, [height, width] pairs of whole tiles of every patch, a tile limit
    only with pinpoints."""
    pairs = all(len(p) == 2 and min(p) > 0 for p in m.anyres_grid_pinpoints)
    if m.anyres_grid_pinpoints and (m.kind != "vision" or not pairs):
        raise ConfigError(f"{key}.anyres_grid_pinpoints tiles a kind = 'vision' modality's images at [height, width] "
                          f"pairs of positive sizes (e.g. [[384, 768], [768, 384]]); got {m.anyres_grid_pinpoints} "
                          f"with kind = '{m.kind}'")
    tile, side = m.vit.image, m.vit.image // m.vit.patch
    if m.anyres_grid_pinpoints and (any(x % tile for p in m.anyres_grid_pinpoints for x in p)
                                    or m.vit.tokens_per_image != side**2):
        raise ConfigError(f"{key}.anyres_grid_pinpoints cuts images into whole {key}.vit.image ({tile}) tiles of "
                          f"{side**2} patch rows each: give pinpoints that are multiples of {tile} (got "
                          f"{m.anyres_grid_pinpoints}) and keep every patch (vit.drop_class_token = true, "
                          "drop_first_patch = false)")
    if m.anyres_max_tiles < 0 or (m.anyres_max_tiles and not m.anyres_grid_pinpoints):
        raise ConfigError(f"{key}.anyres_max_tiles ({m.anyres_max_tiles}) is OneVision's anyres_max_N: >= 0, and "
                          f"> 0 only with {key}.anyres_grid_pinpoints set")


def validate_native_vision(key: str, v: Any, llm: Any) -> None:
    """A kind = "native_vision" modality's `native` table, and the M-RoPE its LM needs."""
    key = f"{key}.native"
    require_at_least(key, v, SIZE_FIELDS["native"], 1)
    if v.hidden % v.heads or (v.hidden // v.heads) % 4:
        raise ConfigError(f"{key}.hidden ({v.hidden}) / heads ({v.heads}) must be a whole head width divisible by 4 "
                          "(the 2D rotary positions turn a quarter of it per axis)")
    if v.family == "qwen2_5_vl" and v.window % (v.patch * v.merge):
        raise ConfigError(f"{key}.window ({v.window} px) must be a multiple of patch x merge = {v.patch * v.merge} "
                          "(0 = no window attention)")
    outside = [i for i in v.full_attention_layers if not 0 <= i < v.layers]
    if outside:
        raise ConfigError(f"{key}.full_attention_layers has {outside}, outside the tower's layers 0..{v.layers - 1}")
    if not (v.rope_theta > 0 and v.tokens_per_second > 0):
        raise ConfigError(f"{key}.rope_theta ({v.rope_theta}) and {key}.tokens_per_second ({v.tokens_per_second}) "
                          "must be > 0")
    if v.video_token_id != -1 and not 0 <= v.video_token_id < llm.vocab and not llm.hf_path:
        raise ConfigError(f"{key}.video_token_id ({v.video_token_id}) must lie in [0, model.llm.vocab={llm.vocab}) "
                          "or be -1 (token_id + 1 on export)")
    if v.max_pixels < v.min_pixels or v.min_pixels < (v.patch * v.merge) ** 2:
        raise ConfigError(f"{key}: need (patch x merge)^2 = {(v.patch * v.merge) ** 2} <= min_pixels ({v.min_pixels}) "
                          f"<= max_pixels ({v.max_pixels}); raise max_pixels or lower min_pixels")
    if not llm.mrope_section and not llm.hf_path:  # a Qwen-VL hf_path sets it
        raise ConfigError("a native_vision modality gives its rows (temporal, height, width) positions: set "
                          "model.llm.mrope_section (three sizes summing to head_dim / 2, e.g. [16, 24, 24] for "
                          "head_dim 128)")


def validate_vision_markers(key: str, m: Any, llm: Any) -> None:
    """A native_vision modality's vision_start_token_id / vision_end_token_id: both -1 (no markers) or two ids of
    the LM's vocabulary apart from each other and from the image and video placeholders."""
    v, key = m.native, f"{key}.native"
    start, end = v.vision_start_token_id, v.vision_end_token_id
    if (start == -1) != (end == -1):
        raise ConfigError(f"{key}.vision_start_token_id ({start}) and {key}.vision_end_token_id ({end}): set both "
                          "(Qwen2-VL's <|vision_start|> and <|vision_end|> ids) or neither (-1)")
    if start == -1:
        return
    for field, value in (("vision_start_token_id", start), ("vision_end_token_id", end)):
        if not 0 <= value < llm.vocab and not llm.hf_path:
            raise ConfigError(f"{key}.{field} ({value}) must lie in [0, model.llm.vocab={llm.vocab}) or be -1 "
                              "(no markers)")
        if value in (m.token_id, v.video_token_id, start if field == "vision_end_token_id" else None):
            raise ConfigError(f"{key}.{field} ({value}) must differ from the modality's token_id ({m.token_id}), "
                              f"native.video_token_id ({v.video_token_id}) and the other marker ({start})")


def validate_out_path(cfg: Config) -> None:
    """The Out path's keys: a generation token id of its own inside the vocabulary, a decoder that tiles."""
    vocab = cfg.model.llm.vocab
    placeholders = {m.token_id: n for n, m in cfg.model.modalities.items()}
    outputs: dict[int, str] = {}
    for name, m in cfg.model.modalities.items():
        key = f"model.modalities.{name}"
        if m.output_token_id == -1:
            continue
        if not 0 <= m.output_token_id < vocab:
            raise ConfigError(f"{key}.output_token_id ({m.output_token_id}) must lie in [0, model.llm.vocab={vocab}) "
                              "or be -1 (no Out path)")
        clash = placeholders.get(m.output_token_id) or outputs.get(m.output_token_id)
        if clash:
            raise ConfigError(f"{key}.output_token_id ({m.output_token_id}) is already used by '{clash}'; "
                              "generation tokens need an id of their own (e.g. 261, GENERATE_IMAGE)")
        outputs[m.output_token_id] = name
        d = m.decoder
        if d.image % d.patch or d.hidden % d.heads:
            raise ConfigError(f"{key}.decoder.image ({d.image}) must be divisible by decoder.patch ({d.patch}) "
                              f"and decoder.hidden ({d.hidden}) by decoder.heads ({d.heads})")
        if m.output_loss_weight < 0:
            raise ConfigError(f"{key}.output_loss_weight ({m.output_loss_weight}) must be >= 0")
