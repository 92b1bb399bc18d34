"""metrics.jsonl and summary.json are strict JSON: a non-finite loss or gradient norm is written as null."""

from __future__ import annotations

import json
from pathlib import Path

from mimo.train.metrics import MetricsLogger
from mimo.train.trainer import Trainer
from tests.support.tiny_run import tiny_config


def _refuse(constant: str) -> float:
    raise ValueError(f"bare {constant} in a JSON file")


def _strict(path: Path) -> list:
    return [json.loads(line, parse_constant=_refuse) for line in path.read_text().splitlines()]


def test_non_finite_numbers_are_written_as_null(tmp_path):
    logger = MetricsLogger(tmp_path, 2, tensorboard=False, progress=False)
    logger.log({"step": 0, "loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3})
    logger.log_eval(0, {"loss": float("-inf"), "tokens": 3})
    logger.write_summary({"final_loss": float("nan"), "eval": {"losses": [1.0, float("nan")]}})
    logger.close()
    step, evaluation = _strict(tmp_path / "metrics.jsonl")
    assert step["loss"] is None and step["grad_norm"] is None and step["lr"] == 1e-3
    assert evaluation["eval_loss"] is None and evaluation["eval_tokens"] == 3
    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=_refuse)
    assert summary["final_loss"] is None and summary["eval"]["losses"] == [1.0, None]


def test_a_run_with_a_skipped_step_writes_strict_json(tmp_path, capsys):
    tr = Trainer(tiny_config(tmp_path, "--train.steps=3"))
    real_step = tr.train_step

    def step(s: int) -> dict:
        rec = real_step(s)
        return {**rec, "loss": float("nan"), "grad_norm": float("nan")} if s == 2 else rec

    tr.train_step = step
    tr.train()
    rows = _strict(tmp_path / "tiny" / "metrics.jsonl")
    assert [r["loss"] is None for r in rows] == [False, False, True]
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text(), parse_constant=_refuse)
    assert summary["final_loss"] is None
    printed = capsys.readouterr().out
    json.loads(printed[printed.index("{\n"):], parse_constant=_refuse)
