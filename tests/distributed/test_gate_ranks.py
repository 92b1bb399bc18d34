"""The validation gate on several ranks: each rank reaches the same refusal on its own, with no collective,
so a bad config stops every rank with one message instead of leaving some waiting."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.config.schema import ConfigError
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.tiny_run import tiny_config

CASES = {  # case -> (overrides, the start of the message)
    "placeholder byte 97": (["--model.modalities.images.token_id=97"], "model.modalities.images.token_id (97)"),
    "empty tokenizer folder": (["--data.name=jsonl", "--data.path=unused.jsonl", "--data.tokenizer={empty}"],
                               "data.tokenizer = "),
    "sequence-parallel ViT of 5 tokens over tp 2": (["--parallel.modules.images.tp=2",
                                                     "--parallel.modules.images.sequence_parallel=true"],
                                                    "module 'images': sequence parallel splits the ViT's 5 tokens"),
}


def _refusal(rank: int, world: int, out: str, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        Trainer(tiny_config(Path(out), *overrides))
    assert not (Path(out) / "tiny").exists()
    return str(err.value)


@pytest.mark.parametrize("case", CASES)
def test_every_rank_refuses_a_bad_config_with_the_same_message(case, tmp_path):
    (tmp_path / "empty").mkdir()
    overrides, start = CASES[case]
    overrides = [o.format(empty=tmp_path / "empty") for o in overrides]
    messages = run_distributed(_refusal, 2, str(tmp_path / "runs"), overrides, timeout=60)
    assert len(set(messages)) == 1 and messages[0].startswith(start), messages
