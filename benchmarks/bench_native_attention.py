"""The native tower's attention over its frames and windows on Qwen2.5-VL's shape (16 heads of 80, 14-pixel patches,
112-pixel windows, benchmarks/presets/native_full.toml): one SDPA per group of equal-length segments (the reference
path) against one variable-length flash attention over all of them (`varlen_attn`, the CUDA path of
mimo.models.segment_attention), forward and backward time and error.

The batch: `--images` images with sides drawn with a seed within `--sides` (224 to 1024 pixels), resized as Qwen's
processor does within the preset's pixel bounds (mimo.data.native_images.smart_resize). Errors are against the
grouped path in fp32 (output: max abs; gradients: max abs over max |ref|). "setup ms" is what a forward spends once,
for all its blocks, on the segments (host grouping, copies to the device).

    python -m benchmarks.bench_native_attention                # on a GPU, bf16
"""

from __future__ import annotations

import random
from pathlib import Path

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
from mimo.config.load import load_config
from mimo.data.native_images import smart_resize
from mimo.models.native_vit import block_segments, patch_coordinates
from mimo.models.segment_attention import grouped_segment_attention, varlen_kernel, varlen_segment_attention

KERNELS = ("grouped", "varlen")
NATIVE = load_config(Path(__file__).resolve().parent / "presets" / "native_full.toml").model.modalities["images"].native


def image_grids(images: int, seed: int, sides: tuple[int, int]) -> torch.Tensor:
    """`[images, 3]` patch grids of images with seeded sides in `sides` pixels, resized as Qwen's processor."""
    rng, unit = random.Random(seed), NATIVE.patch * NATIVE.merge
    sizes = [smart_resize(rng.randint(*sides), rng.randint(*sides), unit, NATIVE.min_pixels, NATIVE.max_pixels)
             for _ in range(images)]
    return torch.tensor([[1, h // NATIVE.patch, w // NATIVE.patch] for h, w in sizes])


def measure(kernel: str, layer: str, grids: torch.Tensor, device: torch.device, dtype: torch.dtype, iters: int,
            warmup: int) -> dict:
    coords = patch_coordinates(grids, NATIVE.merge)
    window = NATIVE.window // NATIVE.patch  # 8 patches: the tower's window_patches
    full, windowed = block_segments(coords, window)
    segs = (full if layer == "frames" else windowed).to(device)
    heads, dim = NATIVE.heads, NATIVE.hidden // NATIVE.heads
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(len(coords), heads, dim, generator=g) for _ in range(3)]
    grad_out = torch.randn(len(coords), heads, dim, generator=g).to(device)
    ref_in = [t.to(device).requires_grad_() for t in base]
    ref_out = grouped_segment_attention(*ref_in, segs)
    ref_out.backward(grad_out)
    if kernel == "varlen":
        if varlen_kernel() is None:
            raise RuntimeError(f"torch {torch.__version__} has no torch.nn.attention.varlen")
        fn = lambda q, k, v: varlen_segment_attention(q, k, v, segs, varlen_kernel())  # noqa: E731
    else:
        fn = lambda q, k, v: grouped_segment_attention(q, k, v, segs)  # noqa: E731
    timed = time_kernel(fn, base, grad_out, ref_in, ref_out.detach(), dtype, iters, warmup)
    setup_ms = _median_ms(lambda: [s.to(device) for s in block_segments(coords, window)], device, iters, warmup)
    return {"kernel": kernel, "layer": layer, "patches": len(coords), "segments": len(segs.cu_seqlens) - 1,
            "setup_ms": setup_ms, **timed}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = kernel_parser(__doc__, KERNELS)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sides", type=int, nargs=2, default=(224, 1024), metavar=("LO", "HI"))
    args = ap.parse_args(argv)
    device, dtype = device_dtype(args)
    grids = image_grids(args.images, args.seed, tuple(args.sides))
    rows = [kernel_row({"layer": layer, "kernel": kernel}, measure, kernel, layer, grids, device, dtype, args.iters,
                       args.warmup) for layer in ("windows", "frames") for kernel in args.kernel or KERNELS]
    print(f"{args.images} images, {device.type}, {dtype}, torch {torch.__version__}, median of {args.iters}")
    print(markdown(rows, ["layer", "kernel"], [("patches", "{patches}"), ("segments", "{segments}"),
                                               ("setup ms", "{setup_ms:.3f}"), *FIGURES]))
    return rows


if __name__ == "__main__":
    main()
