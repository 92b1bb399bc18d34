"""The typed config tree: one dataclass per section, the constants every floor shares, `ConfigError`.

`mimo.config.load` reads TOML and dotted overrides into these classes; `mimo.config.validate` checks the
fields that depend on one another. The `model` section is in mimo.config.model_config, the run's sections
(`train`, `precision`, `perf`, `checkpoint`, `metrics`) in mimo.config.train_config; all are importable from
here. Every field carries its one-line doc (`mimo.config.fields.doc`), from which docs/configuration.md is
generated (mimo.config.reference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, get_args

from mimo.config.fields import doc
from mimo.config.model_config import (
    LANGUAGE,
    LLAMA3_ROPE_KEYS,
    AudioConfig,
    DecoderConfig,
    LLMConfig,
    ModalityConfig,
    ModelConfig,
    NativeViTConfig,
    ProjectorConfig,
    ViTConfig,
)
from mimo.config.train_config import (
    CheckpointConfig,
    CompileBackend,
    MetricsConfig,
    PerfConfig,
    PrecisionConfig,
    TrainConfig,
)

COMPILE_BACKENDS = get_args(CompileBackend)
"""torch.compile backends `perf.compile_backend` takes: inductor generates fused kernels; aot_eager traces the
same graphs (Dynamo, then AOTAutograd's joint forward-backward, with the collectives and the checkpointed
recompute) but runs them with eager kernels; eager stops after Dynamo's capture."""

__all__ = [
    "COMPILE_BACKENDS", "LANGUAGE", "LLAMA3_ROPE_KEYS", "AudioConfig", "CheckpointConfig", "Config", "ConfigError",
    "DataConfig", "DecoderConfig", "LLMConfig", "MetricsConfig", "ModalityConfig", "ModelConfig",
    "ModuleLayoutConfig", "NativeViTConfig", "OptimConfig", "ParallelConfig", "PerfConfig", "PrecisionConfig",
    "ProjectorConfig", "RunConfig", "TrainConfig", "ViTConfig",
]


@dataclass
class ModuleLayoutConfig:
    """Where one module runs: a contiguous rank range and its parallel degrees (dp is derived)."""

    offset: int = doc(0, "First rank of the module's range.")
    size: int = doc(0, "Ranks in the module's range (0 = all ranks).")
    tp: int = doc(1, "Tensor-parallel degree.")
    cp: int = doc(1, "Context-parallel degree (the LM's sequence split over ranks).")
    pp: int = doc(1, "Pipeline stages.")
    sequence_parallel: bool = doc(False, "Under tensor parallelism, norms and residuals on sequence shards.")
    fsdp: bool = doc(False, "Shard weights, gradients and optimizer state over the data-parallel ranks (FSDP2).")
    ep: int = doc(1, "Expert parallelism (the LM's MoE layers): ep dp ranks split the experts; divides dp and "
                     "model.llm.moe_experts.")
    virtual_stages: int = doc(1, "Interleaved 1F1B: model chunks per pipeline rank (pp >= 2; 1 = plain 1F1B).")


@dataclass
class ParallelConfig:
    """Per-module layouts. An empty map puts every module on all ranks as pure data parallel."""

    modules: dict[str, ModuleLayoutConfig] = doc({}, "Each module's layout by name "
                                                     "([parallel.modules.<language or modality>]).")
    microbatches: int = doc(1, "Microbatches each step's batch is split into (gradient accumulation, pipelining).")
    timeout_s: float = doc(1800.0, "Seconds a collective waits for the other ranks before the run fails instead "
                                   "of hanging.")


@dataclass
class DataConfig:
    """The data set, its batches and its rows."""

    name: str = doc("shapes", "The data set: shapes, avlm, text_to_image, synthetic (demo and benchmark sets), "
                              "jsonl or webdataset.")
    train_samples: int = doc(6000, "Samples the demo sets make for training.")
    eval_samples: int = doc(300, "Held-out samples (the demo sets make them; real data reads the first of "
                                 "eval_path).")
    global_batch: int = doc(32, "Samples per optimizer step, over all data-parallel ranks.")
    seed: int = doc(1234, "Seed of the data (the demo sets and the shuffle).")
    path: str = doc("", "webdataset: a .tar shard, a folder of them or a brace list; jsonl: a manifest.")
    eval_path: str = doc("", "Real data's held-out split for train.eval_every (a manifest, or shards).")
    image_root: str = doc("", "The folder a manifest's relative image paths start from (\"\" = the manifest's "
                              "own folder).")
    audio_seconds: float = doc(0.0, "Real audio: each clip padded or cut to this length (0 = the longest the "
                                    "encoder takes).")
    tokenizer: str = doc("byte", "\"byte\", or a folder holding a Hugging Face tokenizer.json.")
    prompt_format: Literal["chat", "plain"] = doc("chat", "How real data's chats become tokens: chat (the "
                                                          "tokenizer's chat template, else LLaVA-1.5's) or plain (bare "
                                                          "text; a saved run without this key reads as plain).")
    seq_len: int = doc(64, "Tokens per row of real and synthetic data (a multiple of 8).")
    workers: int = doc(0, "Reader processes (0 reads in the training process).")
    packing: bool = doc(False, "Pack each step's samples into rows of pack_length tokens, each sample attending "
                               "only to itself (on a GPU left unset: on where accepted, rows of seq_len).")
    pack_length: int = doc(0, "Tokens per packed row; holds the longest sample (0: seq_len on a GPU default).")
    balance_lanes: bool = doc(False, "Reorder each step's rows so every data lane and microbatch gets about the "
                                     "same work (same loss and gradients).")
    images_per_sample: int = doc(1, "shapes and synthetic: images per sample (the most, with "
                                    "min_images_per_sample).")
    min_images_per_sample: int = doc(-1, "shapes and synthetic: each sample draws its count from this to "
                                         "images_per_sample; -1 = exactly images_per_sample.")
    repeat_batches: int = doc(0, "synthetic: step s trains on the batch of step s mod N (0 = a new batch each "
                                 "step).")

    @property
    def images_range(self) -> tuple[int, int]:
        """(fewest, most) images per sample of the shapes and synthetic sets."""
        low = self.images_per_sample if self.min_images_per_sample < 0 else self.min_images_per_sample
        return low, self.images_per_sample


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = doc(1e-3, "Peak learning rate.")
    min_lr_ratio: float = doc(0.1, "The final learning rate as a fraction of lr (cosine and linear).")
    warmup_steps: int = doc(30, "Steps of linear warm-up from 0 to lr.")
    schedule: Literal["cosine", "linear", "constant"] = doc("cosine", "The decay after warm-up.")
    weight_decay: float = doc(0.01, "AdamW's decoupled weight decay.")
    beta1: float = doc(0.9, "AdamW's first-moment decay.")
    beta2: float = doc(0.95, "AdamW's second-moment decay.")
    eps: float = doc(1e-8, "AdamW's epsilon.")
    clip: float = doc(1.0, "Clip the global gradient norm to this (0 = no clipping).")
    module_lr: dict[str, float] = doc({}, "Per-module learning rate overriding lr, e.g. {images = 1e-4}.")


@dataclass
class RunConfig:
    """The run's name and folder."""

    name: str = doc("demo_vlm", "The run's name: its outputs go to <out_dir>/<name>/.")
    out_dir: str = doc("runs", "The folder that holds the runs.")
    overwrite: bool = doc(False, "Delete an earlier run's outputs in the folder and start over (or let a resume "
                                 "rewind it); without it such a folder is refused.")


@dataclass
class Config:
    """The whole config: one TOML table per section."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    # The dotted keys the TOML file and the command line left at their defaults (`load_config` fills it in; a
    # Config built in Python leaves none, so its defaults hold everywhere). On CUDA the GPU defaults
    # (mimo.perf.gpu_defaults) set those of the fast paths. Not a field: never dumped.
    left_unset: ClassVar[frozenset[str]] = frozenset()


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the dotted key and the fix."""
