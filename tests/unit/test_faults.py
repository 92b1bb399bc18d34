"""Fault handling in one process: non-finite steps are skipped and logged, a run of them stops the run with a
checkpoint, and SIGTERM saves and stops."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from mimo.train.faults import RunAborted
from mimo.train.trainer import Trainer
from tests.support.tiny_run import metrics, tiny_config


def _poison(tr: Trainer, bad_steps: set[int] | None = None, from_step: int | None = None) -> None:
    """Make the images of some steps NaN, so their loss and gradients are NaN."""
    real = tr.data.global_batch

    def batch(step: int, global_batch: int, seed: int) -> dict:
        b = real(step, global_batch, seed)
        if (bad_steps and step in bad_steps) or (from_step is not None and step >= from_step):
            px = b["modality_inputs"]["images"]["vit"]["pixel_values"]
            b["modality_inputs"]["images"]["vit"]["pixel_values"] = torch.full_like(px, float("nan"))
        return b

    tr.data.global_batch = batch


def test_nan_steps_are_skipped_logged_and_training_goes_on(tmp_path):
    tr = Trainer(tiny_config(tmp_path, "--train.steps=6", "--train.log_every=100"))
    _poison(tr, bad_steps={2, 3})
    weights = {}
    real_step = tr.train_step

    def step(s: int) -> dict:
        rec = real_step(s)
        weights[s] = tr.model.language_model.embed_tokens.weight.detach().clone()
        return rec

    tr.train_step = step
    summary = tr.train()
    assert summary["skipped_steps"] == 2
    logged = {r["step"]: r for r in metrics(tmp_path)}
    assert not logged[2]["stepped"] and not logged[3]["stepped"] and logged[3]["bad_steps"] == 2
    assert logged[5]["stepped"] and logged[5]["bad_steps"] == 0
    assert torch.equal(weights[1], weights[3]) and not torch.equal(weights[3], weights[4])


def test_too_many_bad_steps_stop_with_a_checkpoint(tmp_path):
    tr = Trainer(tiny_config(tmp_path, "--train.steps=10", "--train.max_bad_steps=3"))
    _poison(tr, from_step=2)
    with pytest.raises(RunAborted, match=r"last 3 steps \(train.max_bad_steps = 3\) had a non-finite loss"):
        tr.train()
    ck = tmp_path / "tiny" / "checkpoints" / "step_00000005"
    assert (ck / "COMPLETE.json").is_file()
    resumed = Trainer(tiny_config(tmp_path, "--train.steps=10", "--train.max_bad_steps=3", "--checkpoint.resume=true"))
    assert resumed.checkpointer.resume() == 5 and resumed.guard.consecutive_bad == 3


def test_sigterm_saves_and_stops_cleanly(tmp_path):
    tr = Trainer(tiny_config(tmp_path, "--train.steps=10"))
    real_step = tr.train_step

    def step(s: int) -> dict:
        if s == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(s)

    tr.train_step = step
    summary = tr.train()
    assert summary["stopped"] == "SIGTERM" and summary["steps"] == 4
    assert (tmp_path / "tiny" / "checkpoints" / "step_00000004" / "COMPLETE.json").is_file()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
