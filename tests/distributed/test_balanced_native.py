"""`data.balance_lanes = true` on native-resolution data: a JSONL manifest of images of five sizes (4 x 4 to 16 x 16
patches), a 3-frame video and a missing image (a row with no item), costs from each item's `grid_thw`
(`native_flops`). Every rank then reads the whole batch; two `Trainer` steps give the single-process
(unbalanced) losses and gradients within 1e-5 relative on colocated dp2 x 2 microbatches and on the colocated
fan-in (tower dp2 into LM tp2). Not on a pipeline: a native_vision tower does not run on pipelined layouts yet (its
stage wants per-input row lengths); tests/distributed/test_balanced_lanes.py covers balancing there."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.config.load import load_config
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, trainer_steps

RTOL = 1e-5
STEPS = 2
SIZES = [(128, 128), (32, 32), (40, 72), (32, 40), (96, 64), (33, 33)]  # (height, width)
LANG = "--parallel.modules.language"
TINY = ["--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=2",
        "--model.llm.mlp=64", "--model.modalities.images.native.hidden=16", "--model.modalities.images.native.heads=2",
        "--model.modalities.images.native.mlp=32", "--data.seq_len=160", "--data.global_batch=8", "--data.seed=5",
        "--metrics.progress=false", "--metrics.tensorboard=false", "--train.log_every=1", "--train.threads=1",
        "--optim.warmup_steps=1", "--data.eval_samples=1", "--run.name=native"]
LAYOUTS = {
    "dp2_mb2": (2, ["--parallel.microbatches=2"]),
    "fan_in2": (2, [f"{LANG}.tp=2"]),
}


def write_manifest(folder: Path) -> str:
    rng = np.random.default_rng(0)

    def image(name: str, size: tuple[int, int]) -> str:
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(folder / name)
        return str(folder / name)

    lines = [{"image": image(f"i{k}.png", s), "caption": f"picture {k}"} for k, s in enumerate(SIZES)]
    lines.append({"video": [image(f"v{k}.png", (48, 64)) for k in range(3)], "fps": 1.0, "caption": "a clip"})
    lines.append({"image": str(folder / "missing.png"), "caption": "gone"})
    path = folder / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def _train(out: Path, manifest: str, *overrides: str) -> tuple[list[float], list[dict], list[dict]]:
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, f"--data.path={manifest}",
                                                              f"--run.out_dir={out}", *overrides])
    trainer = Trainer(cfg)
    losses, grads = trainer_steps(trainer, STEPS)
    seen = trainer.balancer.seen if trainer.balancer is not None else []
    return losses, [{n: g.numpy() for n, g in step.items()} for step in grads], seen


def _rank(rank: int, world: int, out: str, manifest: str, layout: list[str]) -> tuple:
    return _train(Path(out), manifest, *layout, "--data.balance_lanes=true")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> str:
    return write_manifest(tmp_path_factory.mktemp("manifest"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, manifest) -> tuple[list[float], list[dict]]:
    threads = torch.get_num_threads()
    losses, grads, _ = _train(tmp_path_factory.mktemp("single"), manifest)
    yield losses, grads
    torch.set_num_threads(threads)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_balanced_native_lanes_train_like_single_process(reference, manifest, tmp_path, layout):
    world, overrides = LAYOUTS[layout]
    losses, grads, seen = run_distributed(_rank, world, str(tmp_path), manifest, overrides, timeout=600)[0]
    assert len(seen) == STEPS and all(f["lane_imbalance"] <= f["lane_imbalance_before"] for f in seen), seen
    assert any(f["bin_imbalance"] < f["bin_imbalance_before"] for f in seen), seen
    assert_trains_like(layout, (losses, grads), reference, RTOL)
