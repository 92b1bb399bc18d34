"""A short demo run: the loss falls, every run output is written, and the CLI can generate from it."""

import json
import math
import subprocess
import sys
from pathlib import Path

from mimo.config.load import load_config
from mimo.train.trainer import Trainer

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo_vlm.toml"


def test_short_run_learns_and_writes_outputs(tmp_path):
    cfg = load_config(DEMO, ["--train.steps=80", "--data.train_samples=1200", "--data.eval_samples=30",
                             f"--run.out_dir={tmp_path}", "--metrics.progress=false", "--train.log_every=5"])
    summary = Trainer(cfg).train()
    run = tmp_path / "demo_vlm"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "lr", "grad_norm", "tokens", "elapsed_s", "model_tflops"} <= set(records[0])
    assert all(0 < r["model_tflops"] < math.inf for r in records)
    assert not {"mfu", "peak_mem_gib"} & set(records[0]), "on a CPU there is no peak to compare against"
    first, last = records[0]["loss"], sum(r["loss"] for r in records[-3:]) / 3
    assert last < 0.35 * first, (first, last)
    for name in ("config.toml", "loss.png", "summary.json"):
        assert (run / name).is_file(), name
    assert (run / "checkpoints" / "step_00000080" / "COMPLETE.json").is_file(), "the final weights: a checkpoint"
    assert any((run / "tensorboard").iterdir())
    saved = json.loads((run / "summary.json").read_text())
    assert saved["steps"] == 80 and saved["eval"]["eval_samples"] == 30 == summary["eval"]["eval_samples"]
    assert 0 < saved["model_tflops"] < math.inf and "mfu" not in saved

    img = tmp_path / "x.png"
    from PIL import Image

    from mimo.data.shapes import make_samples

    Image.fromarray(make_samples(1, 5)[0].images[0]).save(img)
    out = subprocess.run([sys.executable, "-m", "mimo", "generate", "--run", str(run), "--image", str(img),
                          "--prompt", "what color?"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() != ""


def test_cli_help_and_errors():
    for args in (["--help"], ["train", "--help"], ["generate", "--help"], ["eval", "--help"]):
        r = subprocess.run([sys.executable, "-m", "mimo", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "usage" in r.stdout
    r = subprocess.run([sys.executable, "-m", "mimo", "train", str(DEMO), "--train.nope=1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "unknown config key 'train.nope'" in r.stderr
