"""`metrics.wandb` mirrors what metrics.jsonl and summary.json hold to Weights & Biases, and a resumed run
continues the same W&B run.

W&B itself is not a test dependency: a stand-in `wandb` module records every call (init's arguments, each
`log` with its step, the summary, `finish`), and the records are checked against the run's own files.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from mimo.config.schema import ConfigError
from mimo.train.trainer import Trainer
from tests.support.tiny_run import metrics, tiny_config


class _Run:
    def __init__(self, **kwargs):
        self.init = kwargs
        self.logged: list[tuple[int, dict]] = []
        self.summary: dict = {}
        self.finished = False

    def log(self, data: dict, step: int) -> None:
        assert not self.finished
        self.logged.append((step, data))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def wandb_runs(monkeypatch) -> list[_Run]:
    runs: list[_Run] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: runs.append(_Run(**kwargs)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return runs


def test_every_logged_step_and_the_summary_reach_wandb(tmp_path, wandb_runs):
    Trainer(tiny_config(tmp_path, "--train.steps=4", "--metrics.wandb=true", "--metrics.wandb_project=vlm")).train()
    [run] = wandb_runs
    assert run.init["project"] == "vlm" and run.init["name"] == "tiny" and run.init["resume"] == "allow"
    assert run.init["dir"] == str(tmp_path / "tiny")
    assert run.init["config"]["model"]["llm"]["hidden"] == 32
    assert (tmp_path / "tiny" / "wandb_run_id").read_text().strip() == run.init["id"]
    rows = metrics(tmp_path)
    assert [step for step, _ in run.logged] == [r["step"] for r in rows] == [0, 1, 2, 3]
    for (_, data), row in zip(run.logged, rows):
        assert data["train/loss"] == row["loss"] and data["train/lr"] == row["lr"]
        assert data["train/stepped"] == row["stepped"] and "train/step" not in data
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text())
    assert run.summary["summary/final_loss"] == summary["final_loss"]
    assert run.summary["summary/eval/accuracy"] == summary["eval"]["accuracy"]
    assert run.finished


def test_a_resumed_run_continues_its_wandb_run_and_a_fresh_one_starts_another(tmp_path, wandb_runs):
    Trainer(tiny_config(tmp_path, "--train.steps=2", "--checkpoint.save_every=2", "--metrics.wandb=true")).train()
    Trainer(tiny_config(tmp_path, "--train.steps=4", "--checkpoint.resume=true", "--metrics.wandb=true")).train()
    Trainer(tiny_config(tmp_path, "--train.steps=2", "--metrics.wandb=true", "--run.overwrite=true")).train()
    first, resumed, fresh = wandb_runs
    assert resumed.init["id"] == first.init["id"]
    assert [step for step, _ in resumed.logged] == [2, 3]
    assert fresh.init["id"] != first.init["id"], "a run from step 0 in the same folder is a new W&B run"
    assert (tmp_path / "tiny" / "wandb_run_id").read_text().strip() == fresh.init["id"]


def test_wandb_without_the_package_names_the_field(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"metrics\.wandb = true needs the wandb package: pip install wandb"):
        Trainer(tiny_config(tmp_path, "--metrics.wandb=true"))
