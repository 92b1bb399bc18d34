"""A tiny demo run for checkpoint and fault tests: a few milliseconds per step on one CPU thread.

`train_rank` is the per-rank function for tests.support.dist.run_distributed; each rank writes its pid so a
test can kill it from outside (SIGKILL or SIGTERM) at a moment of its choosing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mimo.config.load import load_config
from mimo.config.schema import Config
from mimo.train.trainer import Trainer

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo_vlm.toml"
TINY = ["--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=1",
        "--model.llm.mlp=64", "--model.modalities.images.vit.patch=16", "--model.modalities.images.vit.hidden=32",
        "--model.modalities.images.vit.layers=1", "--model.modalities.images.vit.heads=2",
        "--model.modalities.images.vit.mlp=64", "--data.train_samples=48", "--data.eval_samples=3",
        "--data.global_batch=4", "--optim.warmup_steps=2", "--run.name=tiny", "--metrics.progress=false",
        "--metrics.tensorboard=false", "--train.log_every=1", "--train.threads=1"]


def tiny_config(out_dir: Path, *overrides: str) -> Config:
    return load_config(DEMO, [*TINY, f"--run.out_dir={out_dir}", *overrides])


def metrics(out_dir: Path) -> list[dict]:
    path = Path(out_dir) / "tiny" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def train_losses(out_dir: Path, *overrides: str) -> list[float]:
    """Train a tiny run in this process; the loss of each logged step."""
    Trainer(tiny_config(out_dir, *overrides)).train()
    return [r["loss"] for r in metrics(out_dir)]


def pid_files(out_dir: Path) -> list[Path]:
    return sorted((Path(out_dir) / "pids").glob("rank_*"))


def train_rank(rank: int, world: int, out_dir: str, overrides: list[str]) -> dict:
    """One rank of a tiny run: record this process's pid, then train."""
    pids = Path(out_dir) / "pids"
    pids.mkdir(parents=True, exist_ok=True)
    (pids / f"rank_{rank}").write_text(str(os.getpid()))
    return Trainer(tiny_config(Path(out_dir), *overrides)).train()


# samples of 0 to 3 images, on a model wide enough to learn something in a few steps
MIXED_IMAGES = ["--data.min_images_per_sample=0", "--data.images_per_sample=3", "--data.global_batch=8",
                "--data.seed=3", "--model.llm.layers=2", "--model.llm.heads=4", "--model.llm.kv_heads=2",
                "--optim.eps=1e-2"]


# tiny_run's ViT gives 4 tokens per image: 3 images are 12 placeholders, then 12 text tokens.
SYNTHETIC = ["--data.name=synthetic", "--data.images_per_sample=3", "--data.seq_len=24", "--train.steps=4"]
