"""Synthetic data on 2 ranks gives the single-process run's losses."""

import math

import pytest

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.tiny_run import SYNTHETIC, metrics, tiny_config, train_rank


def test_same_losses_on_one_process_and_on_dp2(tmp_path, one_thread):
    single = Trainer(tiny_config(tmp_path / "one", *SYNTHETIC)).train()
    assert single["eval"] == {}
    run_distributed(train_rank, 2, str(tmp_path / "two"), SYNTHETIC, timeout=120)
    ref, dp2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(ref) == len(dp2) == 4 and all(math.isfinite(r["loss"]) for r in ref)
    for a, b in zip(ref, dp2):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
