"""Attention kernels on a preset's two attention shapes: forward and backward time, TFLOP/s, error.

The language model's attention (causal, grouped KV heads) and the ViT's (bidirectional) are timed alone
with each SDPA backend and FlexAttention, so a backend choice (`perf.attention_backend` of the presets) can be
checked on a new card or PyTorch in a minute instead of a full training run. Errors are against the math
backend in fp32 on the same inputs (output: max abs; gradients: max abs over max |reference|).

    python -m benchmarks.bench_attention --preset small                  # on a GPU, bf16
    python -m benchmarks.bench_attention --preset tiny --device cpu      # CPU kernels, fp32
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.nn.attention import sdpa_kernel

from benchmarks.workload import MODALITY, load_preset, model_config
from mimo.models.layers import attention
from mimo.perf.regional import SDPA_KERNELS

KERNELS = (*SDPA_KERNELS, "flex")


@dataclass
class Shape:
    """One attention call: `[batch, heads, seq, head_dim]` queries over `kv_heads` key/value heads."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    causal: bool

    def forward_flops(self) -> float:
        return 4 * self.batch * self.heads * self.seq ** 2 * self.head_dim * (0.5 if self.causal else 1.0)


def preset_shapes(p: dict) -> list[Shape]:
    """The LM's and the ViT's attention of one micro-batch, as the benchmark's model builds them."""
    cfg = model_config(p)
    lm, vit = cfg.llm, cfg.modalities[MODALITY].vit
    return [Shape("lm", p["micro_batch"], lm.heads, lm.kv_heads, p["seq_len"], lm.attention_head_dim, True),
            Shape("vit", p["micro_batch"], vit.heads, vit.heads, vit.positions, vit.hidden // vit.heads, False)]


def attention_fn(kernel: str, s: Shape, device: torch.device) -> Callable[..., torch.Tensor]:
    """`fn(q, k, v)` over `[B, heads, S, D]` on `device` running only `kernel`."""
    gqa = s.heads != s.kv_heads
    if kernel == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        mask = create_block_mask(lambda b, h, q, k: q >= k, None, None, s.seq, s.seq,
                                 device=device) if s.causal else None
        flex = torch.compile(flex_attention)
        return lambda q, k, v: flex(q, k, v, block_mask=mask, enable_gqa=gqa)

    def sdpa(q, k, v):  # the model's own attention call (grouped KV heads passed as they are)
        with sdpa_kernel(SDPA_KERNELS[kernel]):
            return attention(q, k, v, causal=s.causal)
    return sdpa


def _median_ms(fn: Callable[[], object], device: torch.device, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(kernel: str, s: Shape, device: torch.device, dtype: torch.dtype, iters: int, warmup: int) -> dict:
    """One kernel on one shape: times, TFLOP/s (backward = 2.5 x forward FLOPs) and errors vs fp32 math."""
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(s.batch, h, s.seq, s.head_dim, generator=g) for h in (s.heads, s.kv_heads, s.kv_heads)]
    grad_out = torch.randn(s.batch, s.heads, s.seq, s.head_dim, generator=g).to(device)
    ref_in = [t.to(device).requires_grad_() for t in base]
    ref_out = attention_fn("math", s, device)(*ref_in)
    ref_out.backward(grad_out)
    timed = time_kernel(attention_fn(kernel, s, device), base, grad_out, ref_in, ref_out, dtype, iters, warmup)
    fwd, bwd = timed["forward_ms"], timed["backward_ms"]
    return {"kernel": kernel, "shape": s.name, **timed, "forward_tflops": s.forward_flops() / fwd / 1e9,
            "backward_tflops": 2.5 * s.forward_flops() / bwd / 1e9}


FIGURES = [("forward ms", "{forward_ms:.3f}"), ("backward ms", "{backward_ms:.3f}"), ("out err", "{out_err:.1e}"),
           ("grad err", "{grad_err:.1e}")]
"""`time_kernel`'s figures as `markdown` columns."""


def time_kernel(fn: Callable[..., torch.Tensor], base: list[torch.Tensor], grad_out: torch.Tensor,
                ref_in: list[torch.Tensor], ref_out: torch.Tensor, dtype: torch.dtype, iters: int, warmup: int) -> dict:
    """`fn(q, k, v)` on `base` (host q, k, v) in `dtype` on `grad_out`'s device: median forward and backward ms, and
    its errors against the reference run (`ref_in` with their gradients, `ref_out`): output max abs, gradients
    max abs over max |reference|."""
    device = grad_out.device
    q, k, v = (t.to(device, dtype).requires_grad_() for t in base)
    dout = grad_out.to(dtype)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(dout)

    with torch.no_grad():
        fwd = _median_ms(lambda: fn(q, k, v), device, iters, warmup)
    both = _median_ms(forward_backward, device, iters, warmup)
    forward_backward()
    with torch.no_grad():
        out_err = float((fn(q, k, v).float() - ref_out).abs().max())
    grad_err = max(float((t.grad.float() - r.grad).abs().max() / r.grad.abs().max()) for t, r in zip((q, k, v), ref_in))
    return {"forward_ms": fwd, "backward_ms": both - fwd, "out_err": out_err, "grad_err": grad_err}


def kernel_parser(doc: str, kernels: Sequence[str], default: str = "default: all") -> argparse.ArgumentParser:
    """An attention benchmark's arguments: --device, --kernel (repeatable, `default` says what without it), --iters
    and --warmup; the first line of `doc` describes it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kernel", action="append", choices=kernels, help=f"kernel to time (repeatable); {default}")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    return ap


def device_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """The device `--device` names and the dtype timed there: bf16 on CUDA, fp32 elsewhere."""
    device = torch.device(args.device)
    return device, torch.bfloat16 if device.type == "cuda" else torch.float32


def kernel_row(labels: dict, measure: Callable[..., dict], *args: object) -> dict:
    """`labels` and `measure(*args)`'s figures; where it raises (a kernel this build, device or shape lacks),
    `labels` and the first line of the error, so that the table shows why."""
    try:
        return {**labels, **measure(*args)}
    except Exception as e:
        return {**labels, "error": (str(e).splitlines() or [type(e).__name__])[0][:160]}


def markdown(rows: list[dict], labels: list[str], columns: list[tuple[str, str]]) -> str:
    """`rows` as a Markdown table: each row's `labels` keys, then `columns` ((header, format of the row's keys)
    each); a row with an "error" shows it in place of its figures."""
    heads = [*labels, *(head for head, _ in columns)]
    lines = ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    for r in rows:
        figures = [r["error"], *[""] * (len(columns) - 1)] if "error" in r else [f.format(**r) for _, f in columns]
        lines.append("| " + " | ".join([*(str(r[k]) for k in labels), *figures]) + " |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """Markdown, one row per kernel and shape; a kernel that failed shows why."""
    return markdown(rows, ["shape", "kernel"], [
        ("forward ms", "{forward_ms:.3f}"), ("TFLOP/s", "{forward_tflops:.3g}"), ("backward ms", "{backward_ms:.3f}"),
        ("TFLOP/s", "{backward_tflops:.3g}"), ("out err", "{out_err:.1e}"), ("grad err", "{grad_err:.1e}")])


def main(argv: list[str] | None = None) -> list[dict]:
    ap = kernel_parser(__doc__, KERNELS, "default: all on CUDA, flash and math on CPU")
    ap.add_argument("--preset", default="small")
    args = ap.parse_args(argv)
    device, dtype = device_dtype(args)
    kernels = args.kernel or (list(KERNELS) if device.type == "cuda" else ["flash", "math"])
    rows = []
    for s in preset_shapes(load_preset(args.preset)):
        for kernel in kernels:
            rows.append(kernel_row({"kernel": kernel, "shape": s.name}, measure, kernel, s, device, dtype, args.iters,
                                   args.warmup))
    print(f"preset `{args.preset}`, {device.type}, {dtype}, median of {args.iters} calls\n\n{table(rows)}")
    return rows


if __name__ == "__main__":
    main()
