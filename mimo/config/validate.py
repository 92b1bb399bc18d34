"""Checks of the config alone (no files, no torch, no layout): ranges of single fields and the fields that
depend on one another; the model.* tables' rules are `mimo.config.model_rules`. Pure, so every rank raises the
same `ConfigError` before any collective; the run's other checks (device, tokenizer, layout) follow in
mimo.train.gate."""

from __future__ import annotations

from mimo.config.enums import check_enumerations
from mimo.config.model_rules import require_at_least, validate_model
from mimo.config.schema import Config, ConfigError
from mimo.config.train_config import FLOAT8, PrecisionConfig


def validate_optim(cfg: Config) -> None:
    """Learning rates, schedule and AdamW's hyper-parameters (torch would refuse them in its own words)."""
    o = cfg.optim
    require_at_least("optim", o, ("lr", "weight_decay", "eps", "beta1", "beta2", "min_lr_ratio", "warmup_steps"), 0)
    for name in ("beta1", "beta2"):
        if getattr(o, name) >= 1:
            raise ConfigError(f"optim.{name} = {getattr(o, name)} must lie in [0, 1), e.g. 0.9 or 0.95")
    if o.min_lr_ratio > 1:
        raise ConfigError(f"optim.min_lr_ratio = {o.min_lr_ratio} must lie in [0, 1] (the final lr / optim.lr)")
    modules = cfg.model.module_names
    for name, lr in o.module_lr.items():
        if name not in modules:
            raise ConfigError(f"optim.module_lr.{name}: '{name}' is no module of this model; choose from {modules}")
        if lr < 0:
            raise ConfigError(f"optim.module_lr.{name} = {lr} must be >= 0 (freeze a module with model.freeze_llm "
                              "or model.modalities.<m>.freeze_encoder)")


def validate_train(cfg: Config) -> None:
    """train.*, precision.*, perf.*, checkpoint.*, metrics.*: ranges, module names, the fast paths' needs."""
    t = cfg.train
    require_at_least("train", t, ("steps", "log_every"), 1)
    require_at_least("train", t, ("max_bad_steps", "eval_every"), 0, " (0 turns it off)")
    require_at_least("checkpoint", cfg.checkpoint, ("save_every",), 0, " (0 turns it off)")
    require_at_least("metrics", cfg.metrics, ("throughput_warmup", "time_share_every"), 0)
    require_at_least("train", t, ("threads",), 0, " (0 = automatic, mimo/train/threads.py)")
    if not 0 <= t.host_mmap_threshold_mb <= 32:
        raise ConfigError(f"train.host_mmap_threshold_mb = {t.host_mmap_threshold_mb}: glibc takes 0 to 32 MiB; "
                          "use 1 (the default), or 0 to leave glibc's own threshold")
    require_at_least("checkpoint", cfg.checkpoint, ("keep",), 1)
    modules = cfg.model.module_names
    for name in cfg.precision.module_dtype:
        if name not in modules:
            raise ConfigError(f"precision.module_dtype.{name}: '{name}' is no module of this model; choose from "
                              f"{modules}")
    pending = gpu_default_pending(cfg)
    validate_float8_dtype(cfg.precision, pending)
    for name in cfg.perf.activation_checkpointing:
        if name not in modules:
            raise ConfigError(f"perf.activation_checkpointing names '{name}', which is no module of this model; "
                              f"choose from {modules}")
    for name in cfg.perf.encoder_offload:
        if name not in cfg.model.modalities:
            raise ConfigError(f"perf.encoder_offload names '{name}', which is no modality of this model; choose from "
                              f"{sorted(cfg.model.modalities)}")
    validate_fast_path_keys(cfg, pending)
    if cfg.metrics.peak_tflops <= 0:
        raise ConfigError(f"metrics.peak_tflops ({cfg.metrics.peak_tflops}) must be > 0: one GPU's peak TFLOP/s, "
                          "for MFU")
    if cfg.checkpoint.resume == "":
        raise ConfigError("checkpoint.resume is empty; use false, true (\"auto\") or the path of a checkpoint folder")


GPU_DEFAULT_NEEDS = frozenset({"precision.dtype", "precision.master_weights"})
"""The keys other keys' checks depend on that mimo.perf.gpu_defaults may set (bf16, master weights)."""


def gpu_default_pending(cfg: Config) -> frozenset[str]:
    """The keys of GPU_DEFAULT_NEEDS left unset on CUDA with perf.gpu_defaults: the GPU defaults may still set
    them, so the config-alone checks leave what depends on them to the checks after the GPU defaults."""
    on_gpu = cfg.train.device.startswith("cuda") and cfg.perf.gpu_defaults
    return GPU_DEFAULT_NEEDS & cfg.left_unset if on_gpu else frozenset()


def validate_float8_dtype(p: PrecisionConfig, pending: frozenset[str] = frozenset()) -> None:
    """A "float8" module computes the rest of itself in bf16: precision.dtype must be bfloat16, unless it is
    `pending` (the GPU defaults may still set it; the gate checks again after them)."""
    for name, dtype in p.module_dtype.items():
        if dtype == FLOAT8 and p.dtype != "bfloat16" and "precision.dtype" not in pending:
            raise ConfigError(f"precision.module_dtype.{name} = \"float8\" computes the rest of the module in bf16, "
                              f"so it needs precision.dtype = \"bfloat16\" (got \"{p.dtype}\"); set it")


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
    if native and (len(cfg.model.modalities) != 1 or d.name not in ("jsonl", "webdataset")):
        raise ConfigError(f"model.modalities.{native[0]}.kind = 'native_vision' trains on data.name = 'jsonl' or "
                          "'webdataset' as the model's only modality; set data.name (and data.path) to one of them")
    if d.balance_lanes and not cfg.model.modalities:
        raise ConfigError("data.balance_lanes = true balances the encoders' work between data lanes, and "
                          "model.modalities is empty: every row costs the same; set data.balance_lanes = false")
    if d.packing and d.pack_length < 1:
        raise ConfigError(f"data.packing = true needs data.pack_length (tokens per packed row) >= 1, got "
                          f"{d.pack_length}; set it to at least the longest sample, e.g. 2-4x its length")
    for key in ("moe_aux_loss_weight", "moe_z_loss_weight"):
        if d.packing and getattr(cfg.model.llm, key):
            raise ConfigError(f"model.llm.{key} = {getattr(cfg.model.llm, key)} with data.packing = true: the MoE "
                              "router losses are per row of the LM's input, and a packed row holds several samples "
                              f"(without their padding), so packing would change the objective; set "
                              f"model.llm.{key} = 0 or data.packing = false")


def validate(cfg: Config) -> None:
    """Every check of the config alone: the enumerations' values, then the model's rules first. Raised
    identically on every rank before any collective."""
    check_enumerations(cfg)
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


HALF_ONLY_ATTENTION = ("cudnn", "flash")
"""SDPA backends without float32 kernels: the only one allowed, a float32 module's attention would find none."""


def validate_fast_path_keys(cfg: Config, pending: frozenset[str] = frozenset()) -> None:
    """The fast paths' keys against each other and the device (the layout's checks: mimo.perf.apply); a need
    of precision.dtype or precision.master_weights in `pending` (gpu_default_pending) is left to the later check."""
    p, f = cfg.precision, cfg.perf
    if p.master_weights:
        if p.dtype != "bfloat16" and "precision.dtype" not in pending:
            raise ConfigError(f"precision.master_weights = true turns the weights bf16, so it needs precision.dtype = "
                              f"\"bfloat16\" (got \"{p.dtype}\"); set it, or master_weights = false")
        odd = [n for n, d in p.module_dtype.items() if d not in ("bfloat16", FLOAT8)]
        if odd:
            raise ConfigError(f"precision.module_dtype.{odd[0]} = \"{p.module_dtype[odd[0]]}\" with "
                              "precision.master_weights = true, which turns every module's weights bf16; drop the "
                              "entry or master_weights")
    if f.grad_table and not p.master_weights and "precision.master_weights" not in pending:
        raise ConfigError("perf.grad_table = true works on MasterAdamW's update: set precision.master_weights = true")
    cuda = cfg.train.device.startswith("cuda")
    if f.grad_table and not cuda:
        raise ConfigError(f"perf.grad_table = true needs a GPU (train.device = \"cuda\", got \"{cfg.train.device}\"); "
                          "set perf.grad_table = false on a CPU")
    if f.encoder_offload and not cuda:
        raise ConfigError(f"perf.encoder_offload = {f.encoder_offload} moves weights from a GPU to host memory "
                          f"(train.device = \"cuda\", got \"{cfg.train.device}\"); set perf.encoder_offload = [] "
                          "on a CPU")
    fp32 = [m for m in cfg.model.module_names if p.autocast_of(m) == "float32"
            and (m in p.module_dtype or "precision.dtype" not in pending)]
    if cuda and f.attention_backend in HALF_ONLY_ATTENTION and fp32:
        raise ConfigError(f"perf.attention_backend = \"{f.attention_backend}\" has no float32 kernels, and module "
                          f"'{fp32[0]}' computes in float32 (precision.dtype, precision.module_dtype.{fp32[0]}); set "
                          "precision.dtype = \"bfloat16\" without float32 modules, or attention_backend = "
                          "\"efficient\" or \"default\"")
    outs = [n for n, m in cfg.model.modalities.items() if m.output_token_id >= 0]
    if f.loss_rows_only and outs:
        raise ConfigError(f"perf.loss_rows_only = true keeps the LM's states at the labelled rows only, but the Out "
                          f"path of {outs} decodes its generation tokens' states; set perf.loss_rows_only = false")
