"""`mimo plan --calibrate`: measure the local device and write a profile (mimo.planner.profile, `write_profile`).

On CUDA (bf16 under autocast) or the CPU (fp32), one process, no collectives:

1. matrix products of the shapes transformer layers run, each timed alone; a weighted least-squares line
   `time = fixed + flop / rate` through them (weights 1/time^2: every shape counts by its relative error);
2. SDPA attention, causal and full, forward and forward + backward: the same line over the forward's FLOPs,
   and the backward's ratio to the forward (the median over shapes);
3. a large add (read two tensors, write one): bytes per second; a tiny add: the host's launch time, and
   inside a CUDA graph the GPU's time per kernel;
4. one layer of each module kind at the config's shapes (one microbatch of one GPU; a kind the config lacks
   at a default shape), forward + backward, eagerly and (with perf.compile) compiled: the measured time
   over the time the cost model gives it from 1-3 is that kind's `layer_factor`.

Each call is timed on the host, synchronised: that holds the host's time to issue it (a lone call's launch and
wait, a small layer's launches), which a step pays too. A compiled layer that fails to compile keeps its eager
factor, its error recorded in `measured.layers_s`.

Takes about 25 s on an H200 (plus compilation with perf.compile), a few on a CPU at its small shapes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from mimo.config.schema import AudioConfig, Config, ModalityConfig, ModuleLayoutConfig, ViTConfig
from mimo.models.audio import AudioBlock
from mimo.models.layers import rope_cos_sin
from mimo.models.llm import DecoderLayer
from mimo.models.vit import ViTBlock
from mimo.parallel.grid import Grid
from mimo.perf.regional import use_sdpa_backend
from mimo.planner.cost import decoder_layer, encoder_layer, encoder_positions
from mimo.planner.network import Network
from mimo.planner.profile import Profile
from mimo.train.gate import row_length

GPU_PRODUCTS = [(16384, 1536, 1536), (16384, 8960, 1536), (16384, 1536, 8960), (16384, 2048, 2048),
                (16384, 11008, 2048), (4608, 1024, 1024), (4608, 4096, 1024), (4608, 1024, 4096),
                (16384, 768, 1536), (2048, 1536, 1536), (1024, 1024, 1024), (8192, 8192, 8192)]
CPU_PRODUCTS = [(256, 256, 256), (512, 512, 512), (1024, 256, 256), (512, 1024, 256), (128, 128, 128)]
GPU_ATTENTION = [(8, 12, 2048, 128, True), (4, 16, 4096, 128, True), (8, 16, 577, 64, False),
                 (64, 16, 577, 64, False), (2, 16, 8192, 128, True)]
CPU_ATTENTION = [(2, 4, 128, 32, True), (4, 4, 64, 16, False), (2, 4, 256, 32, True)]
MAX_TOKENS = {"cuda": 16384, "cpu": 512}
"""Most tokens of the layer measurements (a larger microbatch is measured at this many)."""
DEFAULT_VIT = ViTConfig(image=336, patch=14, hidden=1024, layers=1, heads=16, mlp=4096)
DEFAULT_AUDIO = AudioConfig(hidden=1024, layers=1, heads=16, mlp=4096, max_positions=750)


def timed(fn: Callable[[], object], device: str, reps: int = 10, warmup: int = 3) -> float:
    """Seconds per call of `fn`, the median of `reps` timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def fit_line(work: list[float], seconds: list[float]) -> tuple[float, float]:
    """(fixed seconds, work per second) of `seconds = fixed + work / rate`, least squares weighted by 1/t^2;
    where that gives a negative part, (0, the median of work / seconds)."""
    w = [1 / t ** 2 for t in seconds]
    sw, sx, sy = sum(w), sum(wi * x for wi, x in zip(w, work)), sum(wi * y for wi, y in zip(w, seconds))
    sxx = sum(wi * x * x for wi, x in zip(w, work))
    sxy = sum(wi * x * y for wi, x, y in zip(w, work, seconds))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    fixed = (sy - slope * sx) / sw
    if slope <= 0 or fixed < 0:  # noisy timings (a busy machine): no fixed part, the median rate
        return 0.0, statistics.median(x / t for x, t in zip(work, seconds))
    return fixed, 1 / slope


def _dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device == "cuda" else torch.float32


def measure_products(device: str) -> tuple[float, float, list]:
    rows = []
    for m, n, k in GPU_PRODUCTS if device == "cuda" else CPU_PRODUCTS:
        a = torch.randn(m, k, device=device, dtype=_dtype(device))
        b = torch.randn(k, n, device=device, dtype=_dtype(device))
        rows.append((m, n, k, timed(lambda a=a, b=b: a @ b, device)))
    fixed, rate = fit_line([2 * m * n * k for m, n, k, _ in rows], [t for *_, t in rows])
    return fixed, rate / 1e12, rows


def measure_attention(device: str) -> tuple[float, float, float, list]:
    rows = []
    for b, h, s, d, causal in GPU_ATTENTION if device == "cuda" else CPU_ATTENTION:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=_dtype(device), requires_grad=True) for _ in range(3))
        def forward(q=q, k=k, v=v, causal=causal) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        fwd = timed(forward, device)
        both = timed(lambda forward=forward: forward().sum().backward(), device)
        flop = (2 if causal else 4) * b * s * s * h * d
        rows.append((b, h, s, d, causal, flop, fwd, both))
    fixed, rate = fit_line([r[5] for r in rows], [r[6] for r in rows])
    ratio = statistics.median((r[7] - r[6]) / r[6] for r in rows)
    return fixed, rate / 1e12, ratio, rows


def measure_memory(device: str) -> tuple[float, float, float]:
    """(GB/s of a large add, host seconds per eager tiny kernel, GPU seconds per tiny kernel in a graph)."""
    n = 2 ** 28 if device == "cuda" else 2 ** 22
    x, y = (torch.randn(n, device=device, dtype=_dtype(device)) for _ in range(2))
    gbps = 3 * n * x.element_size() / timed(lambda: x + y, device) / 1e9
    tiny = torch.ones(8, device=device)
    launch = timed(lambda: [tiny.add_(1) for _ in range(200)], device) / 200
    if device != "cuda":
        return gbps, launch, launch
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tiny.add_(1)
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(200):
                tiny.add_(1)
    return gbps, launch, timed(graph.replay, device) / 200


def _layer_inputs(cfg: Config, kind: str, device: str) -> tuple[torch.nn.Module, Callable, dict]:
    """(layer, its forward over one microbatch, the shapes) of `kind` at the config's or a default shape."""
    cap = MAX_TOKENS[device]
    samples = max(cfg.data.global_batch // cfg.parallel.microbatches, 1)
    if kind == "decoder":
        llm = cfg.model.llm
        seq = min(row_length(cfg, cfg.model) or cfg.data.seq_len, cap)
        samples = max(min(samples, cap // seq), 1)
        layer = DecoderLayer(llm)
        pos = torch.arange(seq, device=device).expand(samples, seq)
        rope = rope_cos_sin(pos, llm.attention_head_dim, llm.rope_theta, llm.rope_scaling)
        x = torch.randn(samples, seq, llm.hidden, device=device, requires_grad=True)
        return layer, lambda m: m(x, rope), {"samples": samples, "seq": seq}
    found = [n for n, m in cfg.model.modalities.items() if m.kind == ("vision" if kind == "vit" else "audio")]
    shape = (cfg.model.modalities[found[0]].vit if kind == "vit" else cfg.model.modalities[found[0]].audio) \
        if found else (DEFAULT_VIT if kind == "vit" else DEFAULT_AUDIO)
    positions = encoder_positions(cfg, found[0]) if found else (shape.positions if kind == "vit" else 750)
    inputs = max(min(samples, cap // positions), 1)
    layer = ViTBlock(shape) if kind == "vit" else AudioBlock(shape)
    x = torch.randn(inputs, positions, shape.hidden, device=device, requires_grad=True)
    return layer, lambda m: m(x), {"inputs": inputs, "positions": positions, "hidden": shape.hidden,
                                   "heads": shape.heads, "mlp": shape.mlp, "config": bool(found)}


def layer_step(cfg: Config, kind: str, device: str, compiled: bool) -> tuple[Callable[[], None], dict]:
    """One layer's forward + backward (autocast bf16 on CUDA) as a call, and the layer's shapes."""
    layer, run, shapes = _layer_inputs(cfg, kind, device)
    layer = layer.to(device)
    module = torch.compile(layer) if compiled else layer

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = run(module)
        out.float().sum().backward()

    return step, shapes


def modelled_layer(cfg: Config, kind: str, profile: Profile, shapes: dict, compiled: bool) -> float:
    """The cost model's time of the measured layer with no correction (one GPU, no fusion of q/k/v)."""
    perf = dataclasses.replace(cfg.perf, fuse_qkv=False, compile=compiled)
    ref = dataclasses.replace(cfg, perf=perf)
    grid, net = Grid(), Network()
    if kind == "decoder":
        piece = decoder_layer(ref, profile, net, grid, ModuleLayoutConfig(), shapes["samples"], shapes["seq"])
    else:
        name = next((n for n, m in cfg.model.modalities.items() if m.kind == ("vision" if kind == "vit" else "audio")),
                    None)
        if name is None or not shapes["config"]:
            return _default_encoder_layer(ref, kind, profile, shapes)
        piece = encoder_layer(ref, profile, net, name, grid, shapes["inputs"])
    return piece.forward + piece.backward


def _default_encoder_layer(cfg: Config, kind: str, profile: Profile, shapes: dict) -> float:
    """The model's time of a default-shaped encoder layer (a kind the config does not hold)."""
    from_cfg = DEFAULT_VIT if kind == "vit" else DEFAULT_AUDIO
    modality = {"vit": {"kind": "vision", "vit": from_cfg}, "audio": {"kind": "audio", "audio": from_cfg}}[kind]
    model = dataclasses.replace(cfg.model, modalities={"probe": dataclasses.replace(
        next(iter(cfg.model.modalities.values()), ModalityConfig()), **modality)})
    data = dataclasses.replace(cfg.data, name="synthetic", audio_seconds=15.0)
    probe = dataclasses.replace(cfg, model=model, data=data)
    piece = encoder_layer(probe, profile, Network(), "probe", Grid(), shapes["inputs"])
    return piece.forward + piece.backward


def _failure(e: Exception) -> str:
    return f"failed: {type(e).__name__}: {e}"[:500]


def layer_factors(cfg: Config, device: str, profile: Profile) -> tuple[dict, dict, dict]:
    """(factors, shapes, seconds or failure by key) of each layer kind, against `profile`'s model."""
    factors, shapes, layers = {}, {}, {}
    for kind in ("decoder", "vit", "audio"):
        for compiled in (False, True) if cfg.perf.compile else (False,):
            key = f"{kind}.{'compiled' if compiled else 'eager'}"
            try:
                step, shape = layer_step(cfg, kind, device, compiled)
                seconds = timed(step, device, reps=5, warmup=3 if compiled else 2)
            except Exception as e:  # a compiler failure leaves that kind to its eager factor, recorded
                if not compiled:
                    raise
                layers[key] = _failure(e)
                continue
            factors[key] = seconds / modelled_layer(cfg, kind, profile, shape, compiled)
            shapes[kind], layers[key] = shape, seconds
    return factors, shapes, layers


def calibrate(cfg: Config, device: str) -> Profile:
    """A profile of `device` ('cuda' or 'cpu'), its layer factors measured at `cfg`'s shapes."""
    if device == "cuda":
        use_sdpa_backend(cfg.perf.attention_backend)
    mm_fixed, mm_tflops, products = measure_products(device)
    at_fixed, at_tflops, ratio, attention = measure_attention(device)
    gbps, launch, kernel = measure_memory(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    profile = Profile(name, mm_tflops, mm_fixed, at_tflops, at_fixed, ratio, gbps, kernel, launch)
    measured = {"products": products, "attention": attention, "torch": torch.__version__}
    factors, shapes, measured["layers_s"] = layer_factors(cfg, device, profile)
    return dataclasses.replace(profile, layer_factor=factors, layer_shapes=shapes, measured=measured)


def write_profile(cfg: Config, out: str) -> str:
    """`mimo plan --calibrate --out OUT`: calibrate train.device (the CPU when it names CUDA but none is there),
    save the profile to `out` and return the one line that reports it."""
    device = "cuda" if cfg.train.device == "cuda" and torch.cuda.is_available() else "cpu"
    profile = calibrate(cfg, device)
    profile.save(Path(out))
    return (f"mimo: profile of {profile.device} written to {out}: products {profile.matmul_tflops:.1f} TFLOP/s "
            f"(+{profile.matmul_fixed_s * 1e6:.1f} us each), attention {profile.attention_tflops:.1f} TFLOP/s, memory "
            f"{profile.memory_gbps:.0f} GB/s, layer factors "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(profile.layer_factor.items())))

