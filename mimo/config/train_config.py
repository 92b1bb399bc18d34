"""The `train` section of the config: the step loop, precision, the fast paths, checkpoints and rates.

Part of the typed config tree (mimo.config.schema holds the other sections and the whole `Config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

FLOAT8, FLOAT8_RECIPES = "float8", ("tensorwise", "rowwise")  # train.module_dtype's FP8 value, its recipes


@dataclass
class TrainConfig:
    steps: int = 600
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    device: str = "cpu"
    # Compute dtype (float32, or bfloat16 autocast over fp32 weights); module_dtype overrides it for single
    # modules by name, e.g. {images = "float32"} beside a bf16 LM, or {language = "float8"}: FP8 linears, scaled
    # by float8_recipe ("tensorwise" or "rowwise"), the rest in bf16 (mimo/perf/float8.py).
    dtype: str = "float32"
    module_dtype: dict[str, str] = field(default_factory=dict)
    float8_recipe: str = "tensorwise"
    # Intra-op CPU threads per process; 0 = OMP_NUM_THREADS if set, else the usable cores shared among the
    # node's processes, less those the load average says are busy, at most 16 (mimo/train/threads.py).
    threads: int = 0
    # glibc's mmap threshold in MiB, fixed at start (so freed tensors of at least that size go back to the system
    # at once, not kept resident in malloc's heaps); 0 leaves glibc's own, which rises to 32 MiB
    # (mimo/train/host_memory.py). At most 32.
    host_mmap_threshold_mb: int = 1
    # On CUDA, the fast-path keys left unset take the fastest measured values the layout accepts
    # (mimo.perf.gpu_defaults: bf16 with master weights, compile, the chunked loss, ...); false: they keep the
    # defaults written here, as on a CPU.
    gpu_defaults: bool = True
    # GPU fast paths of mimo.perf (benchmarks/ measures them), on every layout: torch.compile each transformer
    # block, the output head + cross-entropy over row chunks without full fp32 logits (vocab-parallel under
    # TP), each attention's q, k and v from one product (each rank's own shards under TP).
    compile: bool = False
    # torch.compile's backend for train.compile: "inductor" (fused kernels), "aot_eager" (the same graphs,
    # forward and backward, run with eager kernels: to tell a compiler problem from a model one) or "eager".
    compile_backend: str = "inductor"
    chunked_loss: bool = False
    fuse_qkv: bool = False
    # Modules ("language" and/or modality names) whose transformer blocks keep only their input for the
    # backward and recompute the rest there: less activation memory for about one more forward of them.
    activation_checkpointing: list[str] = field(default_factory=list)
    # The encoders' compilation under train.compile: "blocks" (each transformer block) or "whole" (each encoder
    # as one graph: a ViT block is less GPU work than the host needs to launch it).
    encoder_compile: str = "blocks"
    # The head and the loss (with chunked_loss) on the rows that carry a label only, and the LM's last layer's
    # output projection, MLP and final norm on those rows too (positions precomputed on the host with the batch).
    loss_rows_only: bool = False
    # The only scaled-dot-product-attention backend allowed on CUDA: "default" (PyTorch picks), "cudnn", "flash",
    # "efficient" or "math".
    attention_backend: str = "default"
    # bf16 weights with fp32 master weights and fp32 AdamW moments (mimo.perf.master_adamw.MasterAdamW, one
    # fused update pass; needs train.dtype = "bfloat16"), in place of fp32 weights under bf16 autocast.
    master_weights: bool = False
    # With master_weights, on CUDA, one process: the update reads each gradient where autograd left it
    # (one Triton kernel over a table of their addresses) instead of copying it into a flat buffer.
    grad_table: bool = False
    # With master_weights, one process: the language model's update starts on a low-priority side stream as
    # soon as its last gradient is in, under the encoders' backward (needs optim.clip = 0: the global norm is
    # not known yet).
    lm_update_early: bool = False
    # On CUDA, one process, with master_weights: after two eager steps, the whole step (forward, backward,
    # optimizer) is captured as one CUDA graph on a high-priority stream and replayed on every batch.
    step_graph: bool = False
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
    # Steps at the start of a run left out of the steady-state rates (summary.json's steady_*, the progress bar):
    # compilation, autotuning and a captured step's eager warm-up and capture happen in them.
    throughput_warmup: int = 3

    # The train keys the TOML file and the command line left at their defaults (`load_config` fills it in; a
    # Config built in Python leaves none, so its defaults hold everywhere). On CUDA the gate turns those of
    # mimo.perf.gpu_defaults to the fastest measured values the layout accepts. Not a field: never dumped.
    left_unset: ClassVar[frozenset[str]] = frozenset()

    def dtype_of(self, module: str) -> str:
        """The compute dtype of `module` ("language" or a modality name): module_dtype's, else dtype."""
        return self.module_dtype.get(module, self.dtype)

    def autocast_of(self, module: str) -> str:
        """The dtype `module`'s autocast runs it in: its dtype, bfloat16 for a "float8" module."""
        return "bfloat16" if self.dtype_of(module) == FLOAT8 else self.dtype_of(module)
