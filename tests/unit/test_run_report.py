"""A resumed run's report covers the whole run: summary.json's wall_s adds the earlier segments' training
time (saved in each checkpoint), loss.png draws every step and the periodic evaluations, and stderr says
where the run folder is and when the final evaluation starts and ends."""

from __future__ import annotations

import json

from PIL import Image

import mimo.train.trainer as trainer_mod
from mimo.train.plot import plot_curve, run_curve, step_ticks
from mimo.train.trainer import Trainer
from tests.support.tiny_run import tiny_config

RUN = ["--train.steps=6", "--checkpoint.save_every=3", "--train.eval_every=2"]


def test_run_curve_joins_earlier_segments_and_eval_points(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "loss": 3.0}, {"step": 1, "loss": None}, {"step": 1, "eval_loss": 2.5, "eval_tokens": 9},
            {"step": 2, "loss": 2.0}, {"step": 4, "loss": 9.9}]  # step 4 is this segment's: taken from memory
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    train, evals = run_curve(metrics, 3, [(3, 1.5), (4, float("nan")), (5, 1.0)])
    assert train == [(0, 3.0), (2, 2.0), (3, 1.5), (5, 1.0)]
    assert evals == [(1, 2.5)]
    plot_curve(train, tmp_path / "loss.png", evals, resumed_at=3)
    assert Image.open(tmp_path / "loss.png").size == (720, 440)
    assert step_ticks(0, 199) == [0, 50, 100, 150] and step_ticks(3, 5) == [3, 4, 5]
    assert step_ticks(0, 1000) == [0, 500, 1000] and step_ticks(100, 600) == [200, 400, 600]


def test_a_resumed_run_reports_the_whole_run(tmp_path, monkeypatch, capsys):
    Trainer(tiny_config(tmp_path, *RUN)).train()
    ckpt = tmp_path / "tiny" / "checkpoints" / "step_00000003"
    first_wall = json.loads((ckpt / "state.json").read_text())["wall_s"]
    assert first_wall > 0
    capsys.readouterr()
    drawn = {}
    real_plot = trainer_mod.plot_curve

    def record(train, path, evals=(), resumed_at=0):
        drawn.update(train=train, evals=evals, resumed_at=resumed_at)
        real_plot(train, path, evals, resumed_at=resumed_at)

    monkeypatch.setattr(trainer_mod, "plot_curve", record)
    Trainer(tiny_config(tmp_path, *RUN, f"--checkpoint.resume={ckpt}", "--run.overwrite=true")).train()
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text())
    assert summary["resumed_at_step"] == 3
    assert 0 < summary["segment_wall_s"] < summary["wall_s"]
    assert abs(summary["wall_s"] - (first_wall + summary["segment_wall_s"])) < 0.05
    assert [s for s, _ in drawn["train"]] == [0, 1, 2, 3, 4, 5]
    assert [s for s, _ in drawn["evals"]] == [1, 3, 5] and drawn["resumed_at"] == 3
    err = capsys.readouterr().err
    assert f"mimo: run folder {tmp_path / 'tiny'} (resuming at step 3)" in err
    assert "mimo: step 3: held-out loss" in err
    assert "mimo: evaluating the trained model" in err and "mimo: evaluation done in" in err
