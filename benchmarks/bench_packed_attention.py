"""Packed documents' attention on a preset's LM shape: the dense-mask path against block-sparse and
variable-length kernels, forward and backward time and error.

Rows of `seq_len` tokens are packed from documents whose lengths are drawn with a seed (`doc_lengths`); a
query sees the keys of its own document at or before it. Kernels:
- `dense`: today's packed path, a `[B, 1, S, S]` bool mask into SDPA (KV heads repeated for the masked kernel);
- `flex`: the model's packed path (`DocumentRows`): FlexAttention over a block mask of the document ids;
- `varlen`: `torch.nn.attention.varlen.varlen_attn` over the rows flattened to `[B * S, heads, D]`, one
  sequence per document (`cu_seqlens`).
Errors are against fp32 math SDPA with the dense mask (output: max abs; gradients: max abs over max |ref|). "mask
ms" is what a forward spends once, for all its layers, on the kernel's mask (for varlen and dense: the whole setup).

    python -m benchmarks.bench_packed_attention --preset small          # on a GPU, bf16
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable

import torch

from benchmarks.bench_attention import (
    FIGURES,
    _median_ms,
    device_dtype,
    kernel_parser,
    kernel_row,
    markdown,
    time_kernel,
)
from benchmarks.workload import load_preset, model_config
from mimo.models.layers import DocumentRows, attention, document_mask

KERNELS = ("dense", "flex", "varlen")


def doc_lengths(seq_len: int, rows: int, seed: int) -> list[list[int]]:
    """Each row's document lengths, summing to `seq_len`: a third short (image + caption, 600-700 tokens at
    576 image tokens), a third long conversations (800-1900), a third text-only (100-1200); the last one of
    a row is cut to fit."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        left, row = seq_len, []
        while left > 0:
            kind = rng.randrange(3)
            n = rng.randint(*((600, 700), (800, 1900), (100, 1200))[kind])
            row.append(min(n, left))
            left -= row[-1]
        out.append(row)
    return out


def document_ids(lengths: list[list[int]]) -> torch.Tensor:
    """`[B, S]` long: each position's document index within its row."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths])


def kernel_fn(kernel: str, lengths: list[list[int]], heads: int, kv_heads: int,
              device: torch.device) -> Callable[..., torch.Tensor]:
    """`fn(q, k, v)` over `[B, heads, S, D]` for packed rows of `lengths`."""
    docs = document_ids(lengths).to(device)
    b, s = docs.shape
    if kernel == "dense":
        pos = torch.arange(s, device=device).expand(b, s)
        mask = document_mask(docs, pos)
        return lambda q, k, v: attention(q, k, v, causal=True, mask=mask)
    if kernel == "flex":  # the model's own packed path (mimo.models.layers.DocumentRows)
        rows = DocumentRows.of(docs)
        return lambda q, k, v: attention(q, k, v, causal=True, mask=rows)
    from torch.nn.attention.varlen import varlen_attn

    flat = [n for r in lengths for n in r]
    cu = torch.tensor([0, *torch.tensor(flat).cumsum(0).tolist()], dtype=torch.int32, device=device)
    longest = max(flat)
    params = inspect.signature(varlen_attn).parameters  # its keywords changed between PyTorch releases
    gqa_arg = "enable_gqa" in params
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}

    def varlen(q, k, v):
        qf, kf, vf = (t.transpose(1, 2).reshape(b * s, t.shape[1], t.shape[3]) for t in (q, k, v))
        if heads != kv_heads and not gqa_arg:
            kf, vf = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (kf, vf))
        extra = {"enable_gqa": True} if heads != kv_heads and gqa_arg else {}
        out = varlen_attn(qf, kf, vf, cu, cu, longest, longest, **causal, **extra)
        return out.view(b, s, heads, -1).transpose(1, 2)
    return varlen


def measure(kernel: str, p: dict, device: torch.device, dtype: torch.dtype, iters: int, warmup: int) -> dict:
    lm = model_config(p).llm
    b, s, h, kvh, d = p["micro_batch"], p["seq_len"], lm.heads, lm.kv_heads, lm.attention_head_dim
    lengths = doc_lengths(s, b, seed=0)
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(b, n, s, d, generator=g) for n in (h, kvh, kvh)]
    grad_out = torch.randn(b, h, s, d, generator=g).to(device)
    ref_in = [t.to(device).requires_grad_() for t in base]
    ref_fn = kernel_fn("dense", lengths, h, kvh, device)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref_out = ref_fn(*ref_in)
        ref_out.backward(grad_out)
    timed = time_kernel(kernel_fn(kernel, lengths, h, kvh, device), base, grad_out, ref_in, ref_out, dtype, iters,
                        warmup)
    ids = document_ids(lengths).to(device)
    setup = (lambda: DocumentRows.of(ids)) if kernel == "flex" else (lambda: kernel_fn(kernel, lengths, h, kvh, device))
    mask_ms = _median_ms(setup, device, iters, warmup)
    return {"kernel": kernel, "docs": sum(len(r) for r in lengths), "mask_ms": mask_ms, **timed}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = kernel_parser(__doc__, KERNELS)
    ap.add_argument("--preset", default="small")
    args = ap.parse_args(argv)
    device, dtype = device_dtype(args)
    rows = [kernel_row({"kernel": kernel}, measure, kernel, load_preset(args.preset), device, dtype, args.iters,
                       args.warmup) for kernel in args.kernel or KERNELS]
    print(f"preset `{args.preset}`, {device.type}, {dtype}, torch {torch.__version__}, median of {args.iters}")
    print(markdown(rows, ["kernel"], [("docs", "{docs}"), ("mask ms (once a forward)", "{mask_ms:.3f}"), *FIGURES]))
    return rows


if __name__ == "__main__":
    main()
