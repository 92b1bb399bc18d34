"""A checkpoint of the other optimizer kind is refused on resume."""

from __future__ import annotations

import pytest

from mimo.train.trainer import Trainer
from tests.support.master_weights import MASTER_SAVES, STEP4
from tests.support.tiny_run import tiny_config


def test_a_checkpoint_of_the_other_optimizer_kind_is_refused(tmp_path):
    Trainer(tiny_config(tmp_path / "master", *MASTER_SAVES)).train()
    plain = [a for a in MASTER_SAVES if "master_weights" not in a and "dtype" not in a]
    with pytest.raises(ValueError, match=r"written with precision.master_weights = true, this run has false"):
        Trainer(tiny_config(tmp_path / "plain", *plain,
                            f"--checkpoint.resume={tmp_path / 'master' / STEP4}")).checkpointer.resume()
    Trainer(tiny_config(tmp_path / "fp32", *plain)).train()
    with pytest.raises(ValueError, match=r"written with precision.master_weights = false, this run has true"):
        Trainer(tiny_config(tmp_path / "again", *MASTER_SAVES,
                            f"--checkpoint.resume={tmp_path / 'fp32' / STEP4}")).checkpointer.resume()
