"""The typed config tree: TOML in, dotted command-line overrides, validation, saved with each run.

Every section is a dataclass. Loading walks the dataclass fields, so an unknown key or a value of
the wrong type is caught at load time with the key's full dotted name and the list of valid keys,
instead of surfacing later as an attribute error deep inside training.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

LANGUAGE = "language"
"""The language model's name among the modules (layouts, dtypes, checkpointing)."""


@dataclass
class LLMConfig:
    """A Llama/Qwen2-style decoder."""

    vocab: int = 320
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    mlp: int = 384
    qkv_bias: bool = True
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    max_seq: int = 4096
    init_std: float = 0.02
    qk_norm: bool = False
    # 0 = hidden // heads; Qwen3 checkpoints set it explicitly.
    head_dim: int = 0
    # Llama 3 RoPE scaling, keys as in HF's rope_scaling (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings); empty = plain RoPE.
    rope_scaling: dict[str, float] = field(default_factory=dict)
    # A Hugging Face Qwen2/Qwen3/Llama directory: its config.json replaces the fields above and its weights load.
    hf_path: str = ""

    @property
    def attention_head_dim(self) -> int:
        """The width of one attention head: `head_dim` when set, else hidden // heads."""
        return self.head_dim or self.hidden // self.heads


@dataclass
class ViTConfig:
    """A CLIP-style vision transformer (pre-LN, GELU MLP, biases, class token, learned positions)."""

    image: int = 32
    patch: int = 8
    channels: int = 3
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    mlp: int = 256
    act: str = "gelu"
    norm_eps: float = 1e-5
    drop_class_token: bool = True
    init_std: float = 0.02
    # SigLIP-style towers: no class token, no pre-LayerNorm, a patch-embedding bias, a final LayerNorm.
    class_token: bool = True
    pre_norm: bool = True
    patch_bias: bool = False
    post_norm: bool = False

    @property
    def positions(self) -> int:
        """Tokens the blocks attend over: the patches, and the class token if there is one."""
        return (self.image // self.patch) ** 2 + int(self.class_token)

    @property
    def tokens_per_image(self) -> int:
        """Rows one image hands the projector (the class token dropped if configured)."""
        return self.positions - int(self.class_token and self.drop_class_token)


@dataclass
class AudioConfig:
    """A Whisper-style audio encoder (conv stem, sinusoidal or learned positions, pre-LN blocks)."""

    n_mels: int = 80
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    mlp: int = 256
    max_positions: int = 1500
    act: str = "gelu"
    norm_eps: float = 1e-5
    learned_positions: bool = False
    init_std: float = 0.02


@dataclass
class ProjectorConfig:
    """Two-layer MLP from encoder width to LM width (LLaVA style)."""

    act: str = "gelu"
    bias: bool = True


@dataclass
class DecoderConfig:
    """The Out path's image decoder: per-patch pixels from the LM's states at generation tokens.

    One generated image takes (image / patch)^2 generation tokens; `hidden` is the width of the output
    projection and of the decoder's bidirectional blocks."""

    image: int = 32
    patch: int = 8
    channels: int = 3
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    mlp: int = 256
    act: str = "gelu"
    init_std: float = 0.02


@dataclass
class ModalityConfig:
    """One modality submodule: its encoder, its input projection and its placeholder token."""

    kind: str = "vision"
    token_id: int = 259
    vit: ViTConfig = field(default_factory=ViTConfig)
    # kind = "audio": a Whisper-style encoder over log-mel features.
    audio: AudioConfig = field(default_factory=AudioConfig)
    projector: ProjectorConfig = field(default_factory=ProjectorConfig)
    freeze_encoder: bool = False
    freeze_projector: bool = False
    # A Hugging Face CLIP/SigLIP (vision) directory: its config.json replaces the vit fields (drop_class_token
    # and init_std stay) and its weights load. hf_feature_layer picks the hidden state that feeds the
    # projector, as LLaVA's vision_feature_layer: -1 = last layer, -2 = penultimate (LLaVA-1.5 with CLIP).
    hf_path: str = ""
    hf_feature_layer: int = -1
    # The Out path: generation tokens with this id (-1 = none) have their LM states decoded into this
    # modality; its loss (per output token) is added to the text loss with this weight.
    output_token_id: int = -1
    output_loss_weight: float = 1.0
    decoder: DecoderConfig = field(default_factory=DecoderConfig)


@dataclass
class ModelConfig:
    llm: LLMConfig = field(default_factory=LLMConfig)
    modalities: dict[str, ModalityConfig] = field(default_factory=dict)
    freeze_llm: bool = False

    @property
    def module_names(self) -> list[str]:
        """Every module's name as layouts, dtypes and checkpointing name it: the language model's, then each
        modality's."""
        return [LANGUAGE, *self.modalities]


@dataclass
class ModuleLayoutConfig:
    """Where one module runs: a contiguous rank range and its parallel degrees (dp is derived)."""

    offset: int = 0
    size: int = 0
    tp: int = 1
    cp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    fsdp: bool = False


@dataclass
class ParallelConfig:
    """Per-module layouts. An empty map puts every module on all ranks as pure data parallel."""

    modules: dict[str, ModuleLayoutConfig] = field(default_factory=dict)
    microbatches: int = 1


@dataclass
class DataConfig:
    name: str = "shapes"
    train_samples: int = 6000
    eval_samples: int = 300
    global_batch: int = 32
    seed: int = 1234
    # For name = "webdataset" (a .tar shard, a folder of them, or a brace list) or "jsonl" (a manifest):
    path: str = ""
    tokenizer: str = "byte"
    seq_len: int = 64
    workers: int = 0
    # Sequence packing: each step's samples fill rows of pack_length tokens (greedy first fit), every
    # sample attending only to itself with positions restarting; pack_length must hold the longest sample.
    packing: bool = False
    pack_length: int = 0
    # For name = "synthetic" (random tokens and images, for benchmarks): images per sample, whose placeholders
    # open each seq_len-token sequence.
    images_per_sample: int = 1


@dataclass
class OptimConfig:
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    schedule: str = "cosine"
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0
    module_lr: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainConfig:
    steps: int = 600
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    device: str = "cpu"
    # Compute dtype (float32, or bfloat16 autocast over fp32 weights); module_dtype overrides it for single
    # modules by name, e.g. {images = "float32"} keeps the vision encoder in fp32 beside a bf16 LM.
    dtype: str = "float32"
    module_dtype: dict[str, str] = field(default_factory=dict)
    threads: int = 0
    # GPU fast paths of mimo.perf (benchmarks/ measures them): torch.compile each transformer block, and the
    # output head + cross-entropy over row chunks without full fp32 logits (data-parallel layouts only); each
    # attention's q, k and v from one product (any layout without tensor parallelism).
    compile: bool = False
    chunked_loss: bool = False
    fuse_qkv: bool = False
    # Modules ("language" and/or modality names) whose transformer blocks keep only their input for the
    # backward and recompute the rest there: less activation memory for about one more forward of them.
    activation_checkpointing: list[str] = field(default_factory=list)
    # Checkpoints (runs/<name>/checkpoints/step_*): every `save_every` steps (0 = only on a stop), newest
    # `keep_checkpoints` kept. resume: false/"never", true/"auto" (newest complete one, if any), or a path.
    save_every: int = 0
    keep_checkpoints: int = 2
    resume: bool | str = False
    # Stop (with a checkpoint) after this many consecutive steps with a non-finite loss or gradient norm.
    max_bad_steps: int = 10
    # Peak TFLOP/s of one GPU that MFU (model FLOP/s / peak) is measured against: 989 = H100/H200 SXM dense
    # bf16 (the benchmarks' figure). Set your card's (e.g. A100: 312) for a meaningful MFU.
    peak_tflops: float = 989.0

    def dtype_of(self, module: str) -> str:
        """The compute dtype of `module` ("language" or a modality name): module_dtype's, else dtype."""
        return self.module_dtype.get(module, self.dtype)


@dataclass
class RunConfig:
    name: str = "demo_vlm"
    out_dir: str = "runs"
    tensorboard: bool = True
    progress: bool = True
    # Mirror the logged scalars and the final summary to Weights & Biases from rank 0 (pip install
    # 'mimo[wandb]'). W&B's environment variables apply, e.g. WANDB_MODE=offline; a resumed run continues
    # its W&B run.
    wandb: bool = False
    wandb_project: str = "mimo"


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the dotted key and the fix."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and where lossless, convert) one value against its annotated type."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a table of {_type_name(tp)} fields, got {value!r}")
        return _build(tp, value, key)
    if origin is dict:
        _, vtp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a table, got {value!r}")
        return {k: _coerce(v, vtp, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        (etp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"'{key}' must be a list, got {value!r}")
        return [_coerce(v, etp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                continue
        raise ConfigError(f"'{key}' must be one of {[_type_name(a) for a in args]}, got {value!r}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"'{key}' must be an integer, got {value!r}")
    if tp in (float, str) and not isinstance(value, tp):
        raise ConfigError(f"'{key}' must be a {_type_name(tp)}, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in hints:
            where = f"'{prefix}'" if prefix else "the top level"
            raise ConfigError(f"unknown config key '{key}'; valid keys in {where}: {', '.join(names)}")
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def _parse_value(text: str) -> Any:
    """Read an override value with TOML syntax; bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot override '{dotted}': '{p}' is a value, not a table")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ['--train.steps=50', '--model.llm.layers', '4'] into a nested dict."""
    tree: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"expected an override like --section.key=value, got '{a}'")
        body = a[2:]
        if "=" in body:
            key, text = body.split("=", 1)
        elif i + 1 < len(args):
            key, text = body, args[i + 1]
            i += 1
        else:
            raise ConfigError(f"override '{a}' has no value; write --{body}=VALUE")
        _set_dotted(tree, key, _parse_value(text))
        i += 1
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(data: dict[str, Any]) -> Config:
    return _build(Config, data)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a TOML file (or the defaults), apply dotted overrides, and validate the whole tree."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{p}' does not exist; pass the path of a TOML file, e.g. "
                              "configs/demo_vlm.toml")
        with p.open("rb") as f:
            data = tomllib.load(f)
    if overrides:
        data = _merge(data, parse_overrides(overrides))
    cfg = from_dict(data)
    validate(cfg)
    return cfg


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
    for key in ("save_every", "max_bad_steps"):
        if getattr(cfg.train, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0 (0 turns it off)")
    for name in cfg.train.activation_checkpointing:
        if name not in modules:
            raise ConfigError(f"train.activation_checkpointing names '{name}', which is no module of this model; "
                              f"choose from {modules}")
    if cfg.train.peak_tflops <= 0:
        raise ConfigError(f"train.peak_tflops ({cfg.train.peak_tflops}) must be > 0: one GPU's peak TFLOP/s, for MFU")
    if cfg.train.keep_checkpoints < 1:
        raise ConfigError("train.keep_checkpoints must be >= 1")
    if cfg.train.resume == "":
        raise ConfigError("train.resume is empty; use false, true (\"auto\") or the path of a checkpoint folder")
    if cfg.data.name in ("webdataset", "jsonl") and not cfg.data.path:
        raise ConfigError(f"data.name = '{cfg.data.name}' needs data.path (a .tar shard or folder of shards for "
                          "webdataset, a .jsonl manifest for jsonl)")
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


def dump_toml(cfg: Config) -> str:
    """Write the resolved config back as TOML (saved in each run folder)."""
    lines: list[str] = []

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return repr(v)

    def emit(table: dict[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        subs = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix and (scalars or not subs):
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {fmt(v)}")
        if scalars:
            lines.append("")
        for k, v in subs.items():
            emit(v, f"{prefix}.{k}" if prefix else k)

    emit(to_dict(cfg), "")
    return "\n".join(lines) + "\n"
