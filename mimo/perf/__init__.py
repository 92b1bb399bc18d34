"""Performance-only code: nothing here changes what a model computes, only how fast and in how much memory.

- `linear_ce`: output head + cross-entropy over row chunks, never holding full fp32 logits.
- `cross_entropy_triton`: that loss chunk as one Triton kernel (GPUs; Triton's interpreter on a CPU).
- `master_adamw`: bf16 model weights, fp32 master weights and moments, one fused update.
- `fused_qkv`: one product for each attention's q, k and v.
- `regional`: per-block torch.compile, activation checkpointing of chosen blocks, SDPA backend choice.
- `apply`: installs what `mimo train`'s config asks for, in order (every switch on every layout).
- `vocab_parallel_ce`: the loss chunk of a vocab-parallel head (LM tensor parallelism).
"""
