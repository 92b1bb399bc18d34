"""Checks of the config alone (no files, no torch, no layout): ranges of single fields and the fields that
depend on one another. Pure, so every rank raises the same `ConfigError` before any collective; the run's
other checks (device, tokenizer, layout) follow in mimo.train.gate."""

from __future__ import annotations

from typing import Any

from mimo.config.schema import COMPILE_BACKENDS, LANGUAGE, LLAMA3_ROPE_KEYS, Config, ConfigError
from mimo.config.train_config import FLOAT8, FLOAT8_RECIPES

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
    if llm.layer_types and (len(llm.layer_types) != llm.layers or set(llm.layer_types) - {"sliding", "full"}):
        raise ConfigError(f"model.llm.layer_types must name each of the {llm.layers} layers 'sliding' or 'full', got "
                          f"{llm.layer_types}")
    if "sliding" in llm.layer_types and llm.sliding_window <= 0:
        raise ConfigError("model.llm.layer_types has sliding layers but model.llm.sliding_window is not set (> 0)")
    if llm.qk_norm_full and not llm.qk_norm:
        raise ConfigError("model.llm.qk_norm_full = true needs model.llm.qk_norm = true (it says how wide the q/k "
                          "norms are)")
    if not llm.head_dim and llm.hidden % llm.heads:
        raise ConfigError(f"model.llm.hidden ({llm.hidden}) must be divisible by model.llm.heads ({llm.heads})")
    validate_mrope(llm)
    validate_rope_scaling(llm)
    if llm.heads % llm.kv_heads:
        raise ConfigError(f"model.llm.heads ({llm.heads}) must be divisible by model.llm.kv_heads "
                          f"({llm.kv_heads})")
    ids: dict[int, str] = {}
    for name, m in cfg.model.modalities.items():
        key = f"model.modalities.{name}"
        if name == LANGUAGE:
            raise ConfigError(f"{key}: '{LANGUAGE}' is the language model's name among the modules (layouts, "
                              "dtypes, checkpoints); rename the modality, e.g. model.modalities.images")
        if m.kind not in ("vision", "native_vision", "audio"):
            raise ConfigError(f"{key}.kind = '{m.kind}' is not supported; use 'vision', 'native_vision' or 'audio'")
        if m.kind == "native_vision":
            validate_native_vision(key, m.native, llm)
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


MOE_GATING = ("softmax", "sigmoid")


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
    if llm.moe_gating not in MOE_GATING:
        raise ConfigError(f"model.llm.moe_gating = '{llm.moe_gating}'; choose one of {', '.join(MOE_GATING)}")
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
    if cfg.train.step_graph:
        raise ConfigError("train.step_graph = true captures the step as one CUDA graph, but the experts read their "
                          "token counts on the host; set train.step_graph = false with model.llm.moe_experts > 0")
    if cfg.train.loss_rows_only:
        raise ConfigError("train.loss_rows_only = true runs the LM's last layer on the labelled rows only, which would "
                          "change what the router losses see; set train.loss_rows_only = false with "
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


NATIVE_ACTS = ("silu", "gelu", "gelu_tanh", "quick_gelu", "relu")
"""Activations of a native-resolution tower's MLP (mimo.models.layers.ACTIVATIONS' names)."""


def validate_anyres(key: str, m: Any) -> None:
    """A modality's anyres tiling: a vision one, [height, width] pairs, a tile limit only with pinpoints."""
    pairs = all(len(p) == 2 and min(p) > 0 for p in m.anyres_grid_pinpoints)
    if m.anyres_grid_pinpoints and (m.kind != "vision" or not pairs):
        raise ConfigError(f"{key}.anyres_grid_pinpoints tiles a kind = 'vision' modality's images at [height, width] "
                          f"pairs of positive sizes (e.g. [[384, 768], [768, 384]]); got {m.anyres_grid_pinpoints} "
                          f"with kind = '{m.kind}'")
    if m.anyres_max_tiles < 0 or (m.anyres_max_tiles and not m.anyres_grid_pinpoints):
        raise ConfigError(f"{key}.anyres_max_tiles ({m.anyres_max_tiles}) is OneVision's anyres_max_N: >= 0, and "
                          f"> 0 only with {key}.anyres_grid_pinpoints set")


def validate_native_vision(key: str, v: Any, llm: Any) -> None:
    """A kind = "native_vision" modality's `native` table, and the M-RoPE its LM needs."""
    key = f"{key}.native"
    require_at_least(key, v, SIZE_FIELDS["native"], 1)
    if v.family not in ("qwen2_vl", "qwen2_5_vl"):
        raise ConfigError(f"{key}.family = '{v.family}' is not supported; use 'qwen2_5_vl' or 'qwen2_vl'")
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
    if v.act not in NATIVE_ACTS:
        raise ConfigError(f"{key}.act = '{v.act}' is not one of {', '.join(NATIVE_ACTS)}")
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


def validate_optim(cfg: Config) -> None:
    """Learning rates, schedule and AdamW's hyper-parameters (torch would refuse them in its own words)."""
    o = cfg.optim
    require_at_least("optim", o, ("lr", "weight_decay", "eps", "beta1", "beta2", "min_lr_ratio", "warmup_steps"), 0)
    for name in ("beta1", "beta2"):
        if getattr(o, name) >= 1:
            raise ConfigError(f"optim.{name} = {getattr(o, name)} must lie in [0, 1), e.g. 0.9 or 0.95")
    if o.min_lr_ratio > 1:
        raise ConfigError(f"optim.min_lr_ratio = {o.min_lr_ratio} must lie in [0, 1] (the final lr / optim.lr)")
    if o.schedule not in ("cosine", "linear", "constant"):
        raise ConfigError(f"optim.schedule = '{o.schedule}'; choose cosine, linear or constant")
    modules = cfg.model.module_names
    for name, lr in o.module_lr.items():
        if name not in modules:
            raise ConfigError(f"optim.module_lr.{name}: '{name}' is no module of this model; choose from {modules}")
        if lr < 0:
            raise ConfigError(f"optim.module_lr.{name} = {lr} must be >= 0 (freeze a module with model.freeze_llm "
                              "or model.modalities.<m>.freeze_encoder)")


def validate_train(cfg: Config) -> None:
    """train.*: steps, dtypes, checkpoints, fast paths."""
    t = cfg.train
    require_at_least("train", t, ("steps", "log_every"), 1)
    require_at_least("train", t, ("save_every", "max_bad_steps", "throughput_warmup", "eval_every"), 0,
                     " (0 turns it off)")
    require_at_least("train", t, ("threads",), 0, " (0 = automatic, mimo/train/threads.py)")
    if not 0 <= t.host_mmap_threshold_mb <= 32:
        raise ConfigError(f"train.host_mmap_threshold_mb = {t.host_mmap_threshold_mb}: glibc takes 0 to 32 MiB; "
                          "use 1 (the default), or 0 to leave glibc's own threshold")
    require_at_least("train", t, ("keep_checkpoints",), 1)
    if t.dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"train.dtype = '{t.dtype}'; choose float32 or bfloat16")
    modules = cfg.model.module_names
    for name, dtype in t.module_dtype.items():
        if name not in modules:
            raise ConfigError(f"train.module_dtype.{name}: '{name}' is no module of this model; choose from {modules}")
        if dtype not in ("float32", "bfloat16", FLOAT8):
            raise ConfigError(f"train.module_dtype.{name} = '{dtype}'; choose float32, bfloat16 or float8")
    pending = gpu_default_pending(t)
    validate_float8_dtype(t, pending)
    if t.float8_recipe not in FLOAT8_RECIPES:
        raise ConfigError(f"train.float8_recipe = '{t.float8_recipe}'; choose one of {', '.join(FLOAT8_RECIPES)}")
    for name in t.activation_checkpointing:
        if name not in modules:
            raise ConfigError(f"train.activation_checkpointing names '{name}', which is no module of this model; "
                              f"choose from {modules}")
    if t.compile_backend not in COMPILE_BACKENDS:
        raise ConfigError(f"train.compile_backend = '{t.compile_backend}'; choose one of {', '.join(COMPILE_BACKENDS)}")
    validate_fast_path_keys(cfg, pending)
    if t.peak_tflops <= 0:
        raise ConfigError(f"train.peak_tflops ({t.peak_tflops}) must be > 0: one GPU's peak TFLOP/s, for MFU")
    if t.resume == "":
        raise ConfigError("train.resume is empty; use false, true (\"auto\") or the path of a checkpoint folder")


GPU_DEFAULT_NEEDS = frozenset({"dtype", "master_weights"})
"""The keys other keys' checks depend on that mimo.perf.gpu_defaults may set (bf16, master weights)."""


def gpu_default_pending(t: Any) -> frozenset[str]:
    """The keys of GPU_DEFAULT_NEEDS left unset on CUDA with train.gpu_defaults: the gate may still set them,
    so the config-alone checks leave what depends on them to its checks after the GPU defaults."""
    return GPU_DEFAULT_NEEDS & t.left_unset if t.device.startswith("cuda") and t.gpu_defaults else frozenset()


def validate_float8_dtype(t: Any, pending: frozenset[str] = frozenset()) -> None:
    """A "float8" module computes the rest of itself in bf16: train.dtype must be bfloat16, unless "dtype" is
    `pending` (the GPU defaults may still set it; the gate checks again after them)."""
    for name, dtype in t.module_dtype.items():
        if dtype == FLOAT8 and t.dtype != "bfloat16" and "dtype" not in pending:
            raise ConfigError(f"train.module_dtype.{name} = \"float8\" computes the rest of the module in bf16, so it "
                              f"needs train.dtype = \"bfloat16\" (got \"{t.dtype}\"); set it")


def validate_data(cfg: Config) -> None:
    """data.* and parallel.microbatches: batch sizes, lengths, readers, packing."""
    d = cfg.data
    require_at_least("data", d, ("global_batch", "train_samples"), 1)
    require_at_least("data", d, ("eval_samples",), 0)
    require_at_least("data", d, ("workers",), 0, " (0 reads in the training process)")
    require_at_least("data", d, ("audio_seconds",), 0, " (0 = the longest clip the audio encoder takes)")
    if cfg.parallel.microbatches < 1:
        raise ConfigError(f"parallel.microbatches = {cfg.parallel.microbatches} must be >= 1")
    if not cfg.parallel.timeout_s > 0:
        raise ConfigError(f"parallel.timeout_s ({cfg.parallel.timeout_s}) must be > 0: the seconds a collective may "
                          "wait for the other ranks")
    if d.name in ("webdataset", "jsonl") and not d.path:
        raise ConfigError(f"data.name = '{d.name}' needs data.path (a .tar shard or folder of shards for "
                          "webdataset, a .jsonl manifest for jsonl)")
    validate_held_out(cfg)
    if d.seq_len < 8 or d.seq_len % 8:
        raise ConfigError(f"data.seq_len ({d.seq_len}) must be a positive multiple of 8")
    if d.images_per_sample < 1:
        raise ConfigError(f"data.images_per_sample ({d.images_per_sample}) must be >= 1")
    if not -1 <= d.min_images_per_sample <= d.images_per_sample:
        raise ConfigError(f"data.min_images_per_sample ({d.min_images_per_sample}) must lie in "
                          f"0..data.images_per_sample ({d.images_per_sample}), or be -1 for exactly "
                          "data.images_per_sample images per sample")
    drawn = (d.images_per_sample, d.min_images_per_sample) != (1, -1)
    if drawn and d.name not in ("synthetic", "shapes"):
        raise ConfigError(f"data.images_per_sample / data.min_images_per_sample are read by data.name = 'synthetic' "
                          f"and 'shapes' only; data.name = '{d.name}' fixes its own images per sample, so leave them "
                          "at 1 and -1")
    if d.repeat_batches < 0 or (d.repeat_batches and d.name != "synthetic"):
        raise ConfigError(f"data.repeat_batches = {d.repeat_batches}: it takes a count >= 0, read by "
                          f"data.name = 'synthetic' only (got '{d.name}'); leave it at 0")
    if d.packing and d.name == "synthetic":
        raise ConfigError("data.packing = true with data.name = 'synthetic': synthetic rows are full, with no padding "
                          "to pack away; set data.packing = false")
    native = [n for n, m in cfg.model.modalities.items() if m.kind == "native_vision"]
    if d.packing and native:
        raise ConfigError(f"data.packing = true with the native_vision modality '{native[0]}': packed rows restart "
                          "one-axis positions, not M-RoPE's; set data.packing = false")
    if native and (len(cfg.model.modalities) != 1 or d.name not in ("jsonl", "webdataset")):
        raise ConfigError(f"model.modalities.{native[0]}.kind = 'native_vision' trains on data.name = 'jsonl' or "
                          "'webdataset' as the model's only modality; set data.name (and data.path) to one of them")
    if d.balance_lanes and not cfg.model.modalities:
        raise ConfigError("data.balance_lanes = true balances the encoders' work between data lanes, and "
                          "model.modalities is empty: every row costs the same; set data.balance_lanes = false")
    if d.packing and d.pack_length < 1:
        raise ConfigError(f"data.packing = true needs data.pack_length (tokens per packed row) >= 1, got "
                          f"{d.pack_length}; set it to at least the longest sample, e.g. 2-4x its length")


def validate(cfg: Config) -> None:
    """Every check of the config alone, model first. Raised identically on every rank before any collective."""
    validate_model(cfg)
    validate_optim(cfg)
    validate_train(cfg)
    validate_data(cfg)
    known = cfg.model.module_names
    for name in cfg.parallel.modules:
        if name not in known:
            raise ConfigError(f"parallel.modules.{name} names no module; modules are: {', '.join(sorted(known))}")


def validate_held_out(cfg: Config) -> None:
    """train.eval_every needs a held-out split: the demo sets make one, real data reads data.eval_path."""
    real = cfg.data.name in ("webdataset", "jsonl")
    if cfg.data.eval_path and not real:
        raise ConfigError(f"data.eval_path is read by data.name = 'webdataset' or 'jsonl' only; data.name = "
                          f"'{cfg.data.name}' makes its own held-out samples (data.eval_samples), so leave it empty")
    if cfg.train.eval_every and real and not cfg.data.eval_path:
        raise ConfigError(f"train.eval_every = {cfg.train.eval_every} with data.name = '{cfg.data.name}' needs "
                          "data.eval_path, the held-out samples (a manifest or shards like data.path's); set it, "
                          "or train.eval_every = 0")
    if cfg.train.eval_every and cfg.data.name == "synthetic":
        raise ConfigError("train.eval_every with data.name = 'synthetic': random data has no held-out split; "
                          "set train.eval_every = 0")
    if cfg.train.eval_every and cfg.data.eval_samples < 1:
        raise ConfigError(f"train.eval_every needs held-out samples; set data.eval_samples >= 1 "
                          f"(got {cfg.data.eval_samples})")


ENCODER_COMPILE = ("blocks", "whole")
ATTENTION_BACKENDS = ("default", "cudnn", "flash", "efficient", "math")
HALF_ONLY_ATTENTION = ("cudnn", "flash")
"""SDPA backends without float32 kernels: the only one allowed, a float32 module's attention would find none."""


def validate_fast_path_keys(cfg: Config, pending: frozenset[str] = frozenset()) -> None:
    """The fast paths' keys against each other and the device (the layout's checks: mimo.perf.apply); a need
    of train.dtype or train.master_weights in `pending` (gpu_default_pending) is left to the later check."""
    t = cfg.train
    if t.encoder_compile not in ENCODER_COMPILE:
        raise ConfigError(f"train.encoder_compile = '{t.encoder_compile}'; choose one of {', '.join(ENCODER_COMPILE)}")
    if t.attention_backend not in ATTENTION_BACKENDS:
        raise ConfigError(f"train.attention_backend = '{t.attention_backend}'; choose one of "
                          f"{', '.join(ATTENTION_BACKENDS)}")
    if t.master_weights:
        if t.dtype != "bfloat16" and "dtype" not in pending:
            raise ConfigError(f"train.master_weights = true turns the weights bf16, so it needs train.dtype = "
                              f"\"bfloat16\" (got \"{t.dtype}\"); set it, or master_weights = false")
        odd = [n for n, d in t.module_dtype.items() if d not in ("bfloat16", FLOAT8)]
        if odd:
            raise ConfigError(f"train.module_dtype.{odd[0]} = \"{t.module_dtype[odd[0]]}\" with train.master_weights = "
                              "true, which turns every module's weights bf16; drop the entry or master_weights")
    needs_master = {"grad_table": t.grad_table, "lm_update_early": t.lm_update_early, "step_graph": t.step_graph}
    for key, on in needs_master.items():
        if on and not t.master_weights and "master_weights" not in pending:
            raise ConfigError(f"train.{key} = true works on MasterAdamW's update: set train.master_weights = true")
    cuda = t.device.startswith("cuda")
    for key in ("grad_table", "step_graph"):
        if getattr(t, key) and not cuda:
            raise ConfigError(f"train.{key} = true needs a GPU (train.device = \"cuda\", got \"{t.device}\"); set "
                              f"train.{key} = false on a CPU")
    fp32 = [m for m in cfg.model.module_names if t.autocast_of(m) == "float32"
            and (m in t.module_dtype or "dtype" not in pending)]
    if cuda and t.attention_backend in HALF_ONLY_ATTENTION and fp32:
        raise ConfigError(f"train.attention_backend = \"{t.attention_backend}\" has no float32 kernels, and module "
                          f"'{fp32[0]}' computes in float32 (train.dtype, train.module_dtype.{fp32[0]}); set "
                          "train.dtype = \"bfloat16\" without float32 modules, or attention_backend = \"efficient\" "
                          "or \"default\"")
    inside = [k for k in ("lm_update_early", "step_graph") if getattr(t, k)]
    if inside and cfg.optim.clip > 0:
        raise ConfigError(f"train.{inside[0]} = true updates the weights inside the step, before the host knows the "
                          f"global gradient norm, so it cannot clip by it: set optim.clip = 0 (got {cfg.optim.clip}), "
                          f"or train.{inside[0]} = false")
    if t.lm_update_early and cfg.parallel.microbatches != 1:
        raise ConfigError(f"train.lm_update_early = true updates the language model after its one backward of the "
                          f"step, so it takes parallel.microbatches = 1 (got {cfg.parallel.microbatches}); raise "
                          "data.global_batch instead, or set lm_update_early = false")
    outs = [n for n, m in cfg.model.modalities.items() if m.output_token_id >= 0]
    if t.loss_rows_only and outs:
        raise ConfigError(f"train.loss_rows_only = true keeps the LM's states at the labelled rows only, but the Out "
                          f"path of {outs} decodes its generation tokens' states; set train.loss_rows_only = false")
