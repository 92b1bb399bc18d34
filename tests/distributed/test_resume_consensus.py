"""Ranks agree on which checkpoint to load: a part that only one rank reads (its RNG file) being unreadable
makes every rank skip that checkpoint together, instead of one rank loading it while another falls back
and both wait forever."""

from __future__ import annotations

import json
from pathlib import Path

from mimo.train.checkpoint.store import crc32
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.tiny_run import metrics, tiny_config, train_rank

RUN = ["--train.steps=6", "--checkpoint.save_every=2", "--checkpoint.keep=3"]


def _resume_rank(rank: int, world: int, out_dir: str, overrides: list[str]) -> dict:
    tr = Trainer(tiny_config(Path(out_dir), *overrides))
    summary = tr.train()
    return {"final_loss": summary["final_loss"], "resumed_from": tr.checkpointer.resumed_from,
            "ignored": tr.checkpointer.ignored}


def _garble(ckpt: Path, rel: str, text: str) -> None:
    """Replace one file and reseal the marker, so only the rank that reads the file can tell."""
    (ckpt / rel).write_text(text)
    marker = json.loads((ckpt / "COMPLETE.json").read_text())
    marker["files"][rel] = {"size": (ckpt / rel).stat().st_size, "crc32": crc32(ckpt / rel)}
    (ckpt / "COMPLETE.json").write_text(json.dumps(marker))


def test_an_unreadable_rng_file_of_one_rank_makes_all_ranks_skip_that_checkpoint(tmp_path):
    ref = tmp_path / "ref"
    run_distributed(train_rank, 2, str(ref), RUN, timeout=240)
    expected = [(r["step"], r["loss"]) for r in metrics(ref)]

    out = tmp_path / "run"
    run_distributed(train_rank, 2, str(out), RUN, timeout=240)
    root = out / "tiny" / "checkpoints"
    _garble(root / "step_00000006", "rng/rank_00001.json", "garbage, not JSON")
    _garble(root / "step_00000004", "rng/rank_00001.json", json.dumps({"torch": "AAAA", "numpy": {}, "python": {}}))
    results = run_distributed(_resume_rank, 2, str(out), [*RUN, "--checkpoint.resume=true"], timeout=240)

    assert [r["resumed_from"] for r in results] == [str(root / "step_00000002")] * 2
    for r in results:
        assert len(r["ignored"]) == 2
        assert "step_00000006: rank 1: " in r["ignored"][0] and "rank_00001.json' is unreadable" in r["ignored"][0]
        assert "step_00000004: rank 1: " in r["ignored"][1] and "not an RNG state" in r["ignored"][1]
    assert [(r["step"], r["loss"]) for r in metrics(out)] == expected
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002", "step_00000004", "step_00000004.damaged",
                                                      "step_00000006", "step_00000006.damaged"]
