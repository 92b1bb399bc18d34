"""The run's sections of the config: `[train]` (the step loop), `[precision]`, `[perf]` (the fast paths),
`[checkpoint]` and `[metrics]`.

Part of the typed config tree (mimo.config.schema holds the other sections and the whole `Config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mimo.config.fields import doc

FLOAT8 = "float8"
"""precision.module_dtype's FP8 value: FP8 linears (mimo/perf/float8.py), the rest of the module in bf16."""

Dtype = Literal["float32", "bfloat16"]
ModuleDtype = Literal["float32", "bfloat16", "float8"]
CompileBackend = Literal["inductor", "aot_eager", "eager"]


@dataclass
class TrainConfig:
    """The step loop: how long, on what, how often to log and evaluate."""

    steps: int = doc(600, "Optimizer steps of the run.")
    seed: int = doc(0, "Seed of the model's initialisation (the data has data.seed).")
    log_every: int = doc(10, "Steps between logged metrics (metrics.jsonl, TensorBoard, the progress bar).")
    eval_every: int = doc(0, "Steps between held-out evaluations (0 = none; real data needs data.eval_path).")
    device: str = doc("cpu", "\"cpu\", \"cuda\", or \"cuda:N\" for one GPU.")
    threads: int = doc(0, "Intra-op CPU threads per process; 0 = OMP_NUM_THREADS if set, else the node's free "
                          "cores shared among its processes, at most 16.")
    host_mmap_threshold_mb: int = doc(1, "glibc's mmap threshold in MiB (0 to 32), so freed tensors that large go "
                                         "back to the system at once; 0 leaves glibc's own.")
    max_bad_steps: int = doc(10, "Stop (with a checkpoint) after this many consecutive steps with a non-finite "
                                 "loss or gradient norm.")


@dataclass
class PrecisionConfig:
    """Compute dtypes, FP8 and master weights."""

    dtype: Dtype = doc("float32", "Compute dtype: float32, or bfloat16 autocast over fp32 weights.")
    module_dtype: dict[str, ModuleDtype] = doc({}, "Per-module compute dtype overriding dtype, e.g. "
                                                   "{images = \"float32\"} or {language = \"float8\"} (FP8 linears, "
                                                   "the rest bf16).")
    float8_recipe: Literal["tensorwise", "rowwise"] = doc("tensorwise", "How a float8 module's linears are scaled.")
    master_weights: bool = doc(False, "bf16 weights with fp32 master weights and AdamW moments (one fused update "
                                      "pass); needs dtype = \"bfloat16\".")

    def dtype_of(self, module: str) -> str:
        """The compute dtype of `module` ("language" or a modality name): module_dtype's, else dtype."""
        return self.module_dtype.get(module, self.dtype)

    def autocast_of(self, module: str) -> str:
        """The dtype `module`'s autocast runs it in: its dtype, bfloat16 for a "float8" module."""
        return "bfloat16" if self.dtype_of(module) == FLOAT8 else self.dtype_of(module)


@dataclass
class PerfConfig:
    """The fast paths (mimo.perf; benchmarks/ measures them). On CUDA those left unset take GPU defaults."""

    gpu_defaults: bool = doc(True, "On CUDA, the fast-path keys left unset take the fastest measured values the "
                                   "layout accepts; false keeps the defaults written here, as on a CPU.")
    compile: bool = doc(False, "torch.compile each transformer block.")
    compile_backend: CompileBackend = doc(
        "inductor", "torch.compile's backend: inductor (fused kernels), aot_eager (the same graphs with eager "
                    "kernels, to tell a compiler problem from a model one) or eager.")
    encoder_compile: Literal["blocks", "whole"] = doc("blocks", "How compile compiles the encoders: each block, or "
                                                                "each encoder as one graph.")
    chunked_loss: bool = doc(False, "The output head and cross-entropy over row chunks, without full fp32 logits "
                                    "(vocab-parallel under TP).")
    fuse_qkv: bool = doc(False, "Each attention's q, k and v from one matmul (each rank's own shards under TP).")
    activation_checkpointing: list[str] = doc([], "Modules (\"language\", modality names) whose blocks recompute "
                                                  "their activations in the backward: less memory, one more forward.")
    encoder_offload: list[str] = doc([], "Modalities whose encoder weights and optimizer states wait in host memory "
                                         "during a colocated pipelined LM's pipeline (GPU only): less memory, two "
                                         "host copies per step.")
    loss_rows_only: bool = doc(False, "The head, the loss and the LM's last layer on the labelled rows only.")
    attention_backend: Literal["default", "cudnn", "flash", "efficient", "math"] = doc(
        "default", "The only scaled-dot-product-attention backend allowed on CUDA (default: PyTorch picks).")
    grad_table: bool = doc(False, "With master_weights, CUDA, one process: the update reads each gradient in "
                                  "place (one Triton kernel over their addresses).")


@dataclass
class CheckpointConfig:
    """Checkpoints, under runs/<name>/checkpoints/step_*."""

    save_every: int = doc(0, "Steps between checkpoints (0 = only at the end or on a stop).")
    keep: int = doc(2, "The newest checkpoints kept.")
    resume: bool | str = doc(False, "false/\"never\", true/\"auto\" (the newest complete checkpoint, if any), or "
                                    "a checkpoint folder's path.")


@dataclass
class MetricsConfig:
    """Where the metrics go and how the rates are measured."""

    tensorboard: bool = doc(True, "Write TensorBoard event files under runs/<name>/tensorboard.")
    progress: bool = doc(True, "Show a progress bar on rank 0.")
    wandb: bool = doc(False, "Mirror the logged scalars and the summary to Weights & Biases (pip install wandb); "
                             "W&B's environment variables apply.")
    wandb_project: str = doc("mimo", "The W&B project of metrics.wandb.")
    peak_tflops: float = doc(989.0, "One GPU's peak TFLOP/s that MFU is measured against (989: H100/H200 dense "
                                    "bf16; A100: 312).")
    throughput_warmup: int = doc(3, "Steps at the start left out of the steady-state rates (compilation, "
                                    "autotuning, capture).")
    time_share_every: int = doc(10, "Every N-th step after the warm-up times each module's forward and backward "
                                    "for summary.json's time_share (0 = never).")
