"""Every config in configs/ still trains: 2 steps of `mimo train CONFIG` (with `--nproc N` on the N gloo ranks a
layout config spans), each made small for a CPU, each step's loss finite. The recipes whose checkpoints and data a
user downloads train on tiny stand-ins written by the test (tests/support/shipped_configs.py)."""

import pytest

from tests.support.shipped_configs import SHIPPED, train_two_steps


@pytest.mark.parametrize("config", SHIPPED)
def test_shipped_config_trains_2_steps(tmp_path, config):
    train_two_steps(config, tmp_path)
