"""A webdataset folder with damaged samples trains on 2 ranks, each reading its own shards."""

from __future__ import annotations

from pathlib import Path

from mimo.data.make_shards import main as make_shards_main
from mimo.train.trainer import Trainer
from tests.support.data_folders import data_overrides, make_folder
from tests.support.dist import run_distributed
from tests.support.tiny_run import tiny_config


def _two_rank_losses(rank: int, world: int, out: str, overrides: list[str]) -> tuple[list[float], dict, int]:
    tr = Trainer(tiny_config(Path(out), *overrides))
    losses = [tr.train_step(s)["loss"] for s in range(3)]
    return losses, tr.data.report(), len(tr.data.image_rows)


def test_two_ranks_decode_their_share_and_match_one_process(tmp_path):
    src = make_folder(tmp_path)
    make_shards_main([str(src), str(tmp_path / "shards")])
    overrides = data_overrides("webdataset", tmp_path / "shards", "--train.steps=3")
    one = Trainer(tiny_config(tmp_path / "one", *overrides))
    expected = [one.train_step(s)["loss"] for s in range(3)]
    results = run_distributed(_two_rank_losses, 2, str(tmp_path / "two"), overrides, timeout=240)
    for losses, report, rows in results:
        assert rows == 4  # half of the global batch of 8
        assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(expected, losses)), (expected, losses)
        assert report == one.data.report()
