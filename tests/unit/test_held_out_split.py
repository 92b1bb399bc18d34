"""train.eval_every needs a held-out split."""

from __future__ import annotations

import pytest

from mimo.config.schema import ConfigError
from tests.support.data_folders import data_overrides
from tests.support.tiny_run import tiny_config


def test_eval_every_needs_a_held_out_split(tmp_path):
    with pytest.raises(ConfigError, match="needs data.eval_path"):
        tiny_config(tmp_path, *data_overrides("jsonl", tmp_path / "x.jsonl", "--train.eval_every=5"))
    with pytest.raises(ConfigError, match="data.eval_path is read by"):
        tiny_config(tmp_path, f"--data.eval_path={tmp_path}")
