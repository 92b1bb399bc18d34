"""The workload of bench_native, shared by its two sides: a seeded JSONL manifest of images of mixed sizes, the
config (benchmarks/presets/native_<size>.toml on that manifest), the global batches mimo's data pipeline makes of
it (both sides train on these very tensors), their Hugging Face layout, and the one FLOPs count of both.

A batch of `data.global_batch` rows: row 0 holds one large image, every other row two or three small ones (sides
multiples of patch x merge inside the tower's pixel range, so Qwen's resize keeps them), then text that fills the
row. The manifest holds exactly one global batch of samples, so every step's batch holds the same items in a
seeded order of rows: the same shapes each step, other grids and pixels per row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.bench_vlm import throughput_fields
from mimo.config.load import load_config
from mimo.config.schema import Config
from mimo.data.batching import COUNTS
from mimo.hf.load import IMAGES
from mimo.models.flops import train_step_flops
from mimo.models.loss import IGNORE_INDEX
from mimo.models.sample_rows import leading_rows
from mimo.models.step_hints import forward_args
from mimo.tasks import build_demo_data

PRESETS = Path(__file__).resolve().parent / "presets"
IMAGE_SIDES = {"full": {"large": (784, 980), "small": (224, 448)}, "tiny": {"large": (64, 128), "small": (32, 64)}}
"""Per size: the range of a large and of a small image's sides in pixels (drawn in steps of patch x merge)."""


def preset(size: str) -> str:
    """The name of the size's TOML under benchmarks/presets."""
    return f"native_{size}"


def manifest_path(out: str | Path) -> Path:
    return Path(out) / "data" / "manifest.jsonl"


def native_config(size: str, out: str | Path, overrides: list[str] = ()) -> Config:
    """The size's TOML on the manifest under `out`, with `overrides` (`--key=value` strings)."""
    return load_config(PRESETS / f"{preset(size)}.toml", [f"--data.path={manifest_path(out)}", *overrides])


def write_manifest(size: str, out: str | Path, seed: int = 0) -> Path:
    """One global batch of samples (see the module docstring) as PNGs of random pixels and a JSONL manifest under
    `out`/data; the same files for the same size and seed."""
    cfg = native_config(size, out)
    native, rows, seq_len = cfg.model.modalities[IMAGES].native, cfg.data.global_batch, cfg.data.seq_len
    step = native.patch * native.merge
    folder = manifest_path(out).parent
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = []
    for row in range(rows):
        kind, count = ("large", 1) if row == 0 else ("small", int(rng.integers(2, 4)))
        lo, hi = IMAGE_SIDES[size][kind]
        images = []
        for k in range(count):
            h, w = (int(x) * step for x in rng.integers(lo // step, hi // step + 1, 2))
            path = folder / f"r{row}_{k}.png"
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
            images.append(path.name)
        caption = "".join(chr(c) for c in rng.integers(ord("a"), ord("z") + 1, seq_len))  # cut to fill the row
        lines.append(json.dumps({"image": images, "caption": caption}))
    manifest_path(out).write_text("\n".join(lines) + "\n")
    return manifest_path(out)


def native_batches(cfg: Config, count: int, data: object | None = None) -> list[dict]:
    """The global batches of steps 0 .. count - 1 that mimo's data pipeline makes of `cfg`'s manifest (`data`: a
    data set already built from it, such as a Trainer's)."""
    data = data if data is not None else build_demo_data(cfg, None)
    return [data.global_batch(k, cfg.data.global_batch, cfg.data.seed) for k in range(count)]


class CycledBatches:
    """The trainer's data interface (`global_batch(step, size, seed)`) over fixed batches, step k taking batch k
    modulo their number: the baseline's pre-made batches, with no reading or decoding inside a step."""

    def __init__(self, batches: list[dict]):
        self.batches = batches

    def global_batch(self, step: int, global_batch: int, seed: int) -> dict:
        return self.batches[step % len(self.batches)]


def hf_batch(batch: dict) -> dict:
    """A mimo batch as `Qwen2_5_VLForConditionalGeneration`'s keywords: the same ids; every item's patches packed
    one after the other with `image_grid_thw`; labels unshifted (transformers shifts them); mimo's M-RoPE
    positions as `position_ids` `[3, B, S]` (so transformers computes none on the host)."""
    visual = batch["modality_inputs"][IMAGES]["visual"]
    grid = visual["grid_thw"]
    patches = grid.prod(-1)
    keep = patches > 0  # a text-only row's stand-in item holds no patches
    labels = batch["labels"]
    shifted = torch.cat([torch.full_like(labels[:, :1], IGNORE_INDEX), labels[:, :-1]], dim=1)
    return {"input_ids": batch["input_ids"], "labels": shifted, "position_ids": batch["position_ids"].permute(2, 0, 1),
            "pixel_values": leading_rows(visual["pixel_values"][keep], patches[keep], "pixel_values"),
            "image_grid_thw": grid[keep]}


def model_inputs(batch: dict) -> dict:
    """A mimo batch as MimoModel's keywords (its per-row item counts are the trainer's, for splitting)."""
    return forward_args({k: v for k, v in batch.items() if k != COUNTS})


def step_flops(cfg: Config, batches: list[dict]) -> float:
    """Model FLOPs of a training step, the mean over `batches`: mimo.models.flops' count (the baseline's
    convention: matmuls at 2 per multiply-add, 3 x forward, encoder attention over each frame or window,
    causal LM attention at half), for both sides."""
    return sum(train_step_flops(cfg.model, b) for b in batches) / len(batches)


def step_tokens(cfg: Config) -> int:
    """LM tokens of a global batch: rows x data.seq_len."""
    return cfg.data.global_batch * cfg.data.seq_len


def result_row(system: str, size: str, cfg: Config, batches: list[dict], timing: dict, model: torch.nn.Module,
               device: torch.device, peak_tflops: float, **extra: object) -> dict:
    """One side's JSON row from bench_vlm.timed_steps' `timing`: throughput in LM tokens (rows x seq_len) and
    model FLOPs (`step_flops`) per second of the median step (bench_vlm.throughput_fields). Raises RuntimeError
    on a non-finite loss."""
    patches = sum(int(b["modality_inputs"][IMAGES]["visual"]["grid_thw"].prod(-1).sum()) for b in batches)
    fields = throughput_fields(timing, step_tokens(cfg), step_flops(cfg, batches), model, device, peak_tflops)
    return {"system": system, "size": size, **fields, "patches_per_step": patches // len(batches), **extra}
