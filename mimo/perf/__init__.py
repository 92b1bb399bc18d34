"""Performance-only code: nothing here changes what a model computes, only how fast and in how much memory.

- `linear_ce`: output head + cross-entropy over row chunks, never holding full fp32 logits.
- `cross_entropy_triton`: that loss chunk as one Triton kernel (GPUs; Triton's interpreter on a CPU).
- `master_adamw`: bf16 model weights, fp32 master weights and moments, one fused update.
- `fused_qkv`: one product for each attention's q, k and v.
- `regional`: per-block torch.compile, activation checkpointing of chosen blocks, SDPA backend choice.
"""

from mimo.perf.fused_qkv import fuse_qkv
from mimo.perf.linear_ce import CHUNK_KERNELS, chunk_loss_and_grad, linear_cross_entropy
from mimo.perf.master_adamw import MasterAdamW, adamw_update
from mimo.perf.regional import SDPA_BACKENDS, checkpoint_blocks, compile_blocks, use_sdpa_backend

__all__ = ["CHUNK_KERNELS", "MasterAdamW", "SDPA_BACKENDS", "adamw_update", "checkpoint_blocks",
           "chunk_loss_and_grad", "compile_blocks", "fuse_qkv", "linear_cross_entropy", "use_sdpa_backend"]
