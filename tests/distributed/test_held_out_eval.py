"""Periodic evaluation (`train.eval_every`) on the training layout: the held-out loss is logged after every
eval_every-th step (metrics.jsonl, TensorBoard) on 2 data-parallel ranks, on a 3-rank pipeline and with real
data (data.eval_path), and equals one process's: the same run's evaluation on one process at every eval step,
and at the last step a plain forward of the run's final weights over all held-out samples at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mimo.models.step_hints import forward_args
from mimo.tasks import build_demo_data
from mimo.train.checkpoint.weights import load_run
from mimo.train.trainer import Trainer
from tests.support.data_folders import data_overrides, write_manifest
from tests.support.dist import run_distributed
from tests.support.tiny_run import metrics, tiny_config, train_rank

RTOL = 1e-5
# 4 steps, evaluated after steps 1 and 3; 6 held-out samples = one full global batch of 4 and one half empty
EVAL = ["--train.steps=4", "--train.eval_every=2", "--data.eval_samples=6", "--model.llm.layers=2",
        "--metrics.tensorboard=true"]
PIPELINE3 = ["--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
             "--parallel.modules.language.offset=1", "--parallel.modules.language.size=2",
             "--parallel.modules.language.pp=2", "--parallel.microbatches=2"]


def eval_records(out: Path) -> list[dict]:
    return [r for r in metrics(out) if "eval_loss" in r]


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * abs(b)


def forward_loss_of_final_weights(out: Path) -> float:
    """One process, one forward: the per-token loss of the run's final weights on all its held-out samples."""
    cfg, model = load_run(out / "tiny")
    data = build_demo_data(cfg, model)
    with torch.no_grad():
        result = model(**forward_args(data.collate(data.eval)))
    return float(result.loss_sum / result.num_tokens)


@pytest.mark.parametrize("world,layout", [(2, []), (3, PIPELINE3)], ids=["dp2", "pipeline3"])
def test_eval_every_logs_the_held_out_loss_of_one_process(tmp_path, world, layout):
    Trainer(tiny_config(tmp_path / "one", *EVAL)).train()
    expected = eval_records(tmp_path / "one")
    run_distributed(train_rank, world, str(tmp_path / "many"), [*EVAL, *layout], timeout=400)
    got = eval_records(tmp_path / "many")
    assert [r["step"] for r in got] == [r["step"] for r in expected] == [1, 3]
    assert [r["eval_tokens"] for r in got] == [r["eval_tokens"] for r in expected]
    assert all(close(g["eval_loss"], e["eval_loss"]) for g, e in zip(got, expected)), (got, expected)
    assert close(got[-1]["eval_loss"], forward_loss_of_final_weights(tmp_path / "many"))
    assert list((tmp_path / "many" / "tiny" / "tensorboard").glob("events.*"))


def test_real_data_evaluates_data_eval_path_on_two_ranks(tmp_path):
    train = write_manifest(tmp_path / "train", {})
    held_out = write_manifest(tmp_path / "held_out", {i: f"held out {i}" for i in range(40)})  # 7, 23: broken
    overrides = [*data_overrides("jsonl", train, f"--data.eval_path={held_out}"), *EVAL, "--data.eval_samples=26"]
    run_distributed(train_rank, 2, str(tmp_path / "two"), overrides, timeout=400)
    got = eval_records(tmp_path / "two")
    assert [r["step"] for r in got] == [1, 3]
    cfg, model = load_run(tmp_path / "two" / "tiny")
    data = build_demo_data(cfg, model)
    one = data.evaluate(model, samples=26)  # one process, batches of 16: the first 26 held-out samples
    assert one["eval_samples"] == 24  # samples 7 and 23 have broken images
    summary = json.loads((tmp_path / "two" / "tiny" / "summary.json").read_text())
    assert summary["eval"]["held_out_data"]["corrupt_samples"] == 2
    assert close(got[-1]["eval_loss"], one["loss"])
