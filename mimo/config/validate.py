"""Checks of the config alone that need more than one field; raised identically on every rank."""

from __future__ import annotations

from mimo.config.schema import COMPILE_BACKENDS, Config, ConfigError


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


def validate(cfg: Config) -> None:
    """Checks that need more than one field. Raised identically on every rank before any collective."""
    llm = cfg.model.llm
    if not llm.head_dim and llm.hidden % llm.heads:
        raise ConfigError(f"model.llm.hidden ({llm.hidden}) must be divisible by model.llm.heads ({llm.heads})")
    if llm.heads % llm.kv_heads:
        raise ConfigError(f"model.llm.heads ({llm.heads}) must be divisible by model.llm.kv_heads "
                          f"({llm.kv_heads})")
    ids = {}
    for name, m in cfg.model.modalities.items():
        if m.kind not in ("vision", "audio"):
            raise ConfigError(f"model.modalities.{name}.kind = '{m.kind}' is not supported; use 'vision' or 'audio'")
        if m.kind == "audio" and (m.audio.hidden % m.audio.heads or m.audio.hidden % 2):
            raise ConfigError(f"model.modalities.{name}.audio.hidden ({m.audio.hidden}) must be even and divisible "
                              f"by audio.heads ({m.audio.heads})")
        # Hugging Face towers floor the patch grid (SigLIP-so400m: 384 px, 14 px patches); they are the truth.
        if m.vit.image % m.vit.patch and not m.hf_path:
            raise ConfigError(f"model.modalities.{name}.vit.image ({m.vit.image}) must be divisible by "
                              f"vit.patch ({m.vit.patch})")
        if m.vit.hidden % m.vit.heads:
            raise ConfigError(f"model.modalities.{name}.vit.hidden must be divisible by vit.heads")
        if m.vit.drop_first_patch and m.vit.class_token and not m.hf_path:
            raise ConfigError(f"model.modalities.{name}.vit.drop_first_patch is for towers without a class token; "
                              "this one has one: set vit.drop_class_token to drop it, or vit.class_token = false")
        # With model.llm.hf_path the vocabulary comes from its config.json; building the model checks it then.
        if not 0 <= m.token_id < llm.vocab and not llm.hf_path:
            raise ConfigError(f"model.modalities.{name}.token_id ({m.token_id}) must lie in [0, "
                              f"model.llm.vocab={llm.vocab})")
        if m.token_id in ids:
            raise ConfigError(f"model.modalities.{name}.token_id ({m.token_id}) is already used by "
                              f"'{ids[m.token_id]}'; each modality needs its own placeholder id")
        ids[m.token_id] = name
    validate_out_path(cfg)
    if cfg.optim.schedule not in ("cosine", "linear", "constant"):
        raise ConfigError(f"optim.schedule = '{cfg.optim.schedule}'; choose cosine, linear or constant")
    if cfg.train.dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"train.dtype = '{cfg.train.dtype}'; choose float32 or bfloat16")
    modules = cfg.model.module_names
    for name, dtype in cfg.train.module_dtype.items():
        if name not in modules:
            raise ConfigError(f"train.module_dtype.{name}: '{name}' is no module of this model; choose from {modules}")
        if dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"train.module_dtype.{name} = '{dtype}'; choose float32 or bfloat16")
    if cfg.parallel.microbatches < 1:
        raise ConfigError("parallel.microbatches must be >= 1")
    if not cfg.parallel.timeout_s > 0:
        raise ConfigError(f"parallel.timeout_s ({cfg.parallel.timeout_s}) must be > 0: the seconds a collective may "
                          "wait for the other ranks")
    for key in ("save_every", "max_bad_steps", "throughput_warmup", "eval_every"):
        if getattr(cfg.train, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0 (0 turns it off)")
    for name in cfg.train.activation_checkpointing:
        if name not in modules:
            raise ConfigError(f"train.activation_checkpointing names '{name}', which is no module of this model; "
                              f"choose from {modules}")
    if cfg.train.compile_backend not in COMPILE_BACKENDS:
        raise ConfigError(f"train.compile_backend = '{cfg.train.compile_backend}'; choose one of "
                          f"{', '.join(COMPILE_BACKENDS)}")
    if cfg.train.peak_tflops <= 0:
        raise ConfigError(f"train.peak_tflops ({cfg.train.peak_tflops}) must be > 0: one GPU's peak TFLOP/s, for MFU")
    if cfg.train.keep_checkpoints < 1:
        raise ConfigError("train.keep_checkpoints must be >= 1")
    if cfg.train.resume == "":
        raise ConfigError("train.resume is empty; use false, true (\"auto\") or the path of a checkpoint folder")
    if cfg.data.name in ("webdataset", "jsonl") and not cfg.data.path:
        raise ConfigError(f"data.name = '{cfg.data.name}' needs data.path (a .tar shard or folder of shards for "
                          "webdataset, a .jsonl manifest for jsonl)")
    validate_held_out(cfg)
    if cfg.data.seq_len < 8 or cfg.data.seq_len % 8:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) must be a positive multiple of 8")
    if cfg.data.images_per_sample < 1:
        raise ConfigError(f"data.images_per_sample ({cfg.data.images_per_sample}) must be >= 1")
    if cfg.data.images_per_sample != 1 and cfg.data.name != "synthetic":
        raise ConfigError(f"data.images_per_sample = {cfg.data.images_per_sample} is read by data.name = 'synthetic' "
                          f"only; data.name = '{cfg.data.name}' fixes its own images per sample, so leave it at 1")
    if cfg.data.packing and cfg.data.name == "synthetic":
        raise ConfigError("data.packing = true with data.name = 'synthetic': synthetic rows are full, with no padding "
                          "to pack away; set data.packing = false")
    if cfg.data.packing and cfg.data.pack_length < 1:
        raise ConfigError(f"data.packing = true needs data.pack_length (tokens per packed row) >= 1, got "
                          f"{cfg.data.pack_length}; set it to at least the longest sample, e.g. 2-4x its length")
    known = set(cfg.model.module_names)
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
