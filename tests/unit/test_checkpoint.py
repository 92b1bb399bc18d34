"""Checkpoints on one process: atomic publication, crash mid-write, corruption, retention, safe loading."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

import mimo.train.checkpoint.resume as resume_mod
from mimo.config.schema import ConfigError
from mimo.train.checkpoint.safe_dcp import CorruptCheckpointError, read_metadata_file
from mimo.train.checkpoint.store import MARKER, STAGING, CheckpointStore, crc32
from mimo.train.trainer import Trainer
from tests.support.tiny_run import metrics, tiny_config

SAVE = ["--train.steps=6", "--checkpoint.save_every=2"]


class InjectedCrash(Exception):
    pass


def _ckpts(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "tiny" / "checkpoints").iterdir())


def _weights(tr: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tr.model.state_dict().items()}


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    real = resume_mod.save_training_state

    def crash_midway(directory: Path, state: dict) -> None:
        real(directory, state)
        if directory.name.endswith("step_00000004"):
            data = max(directory.glob("*.distcp"), key=os.path.getsize)
            data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
            raise InjectedCrash

    monkeypatch.setattr(resume_mod, "save_training_state", crash_midway)
    with pytest.raises(InjectedCrash):
        Trainer(tiny_config(tmp_path, *SAVE)).train()
    monkeypatch.undo()
    assert _ckpts(tmp_path) == [STAGING + "step_00000004", "step_00000002"]

    tr = Trainer(tiny_config(tmp_path, *SAVE, "--checkpoint.resume=true"))
    assert tr.checkpointer.resume() == 2
    err = capsys.readouterr().err
    assert "ignoring" in err and "step_00000004" in err and "never finished" in err
    assert [r["step"] for r in metrics(tmp_path)] == [0, 1]
    tr.train()
    assert _ckpts(tmp_path) == ["step_00000004", "step_00000006"]


def test_corrupt_checkpoints_are_reported_skipped_and_never_half_loaded(tmp_path, capsys):
    Trainer(tiny_config(tmp_path, *SAVE, "--checkpoint.keep=3")).train()
    root = tmp_path / "tiny" / "checkpoints"
    # newest: one byte changed, size kept (only the CRC sees it); next: truncated (the size check sees it)
    newest = next((root / "step_00000006").glob("*.distcp"))
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    newest.write_bytes(bytes(raw))
    middle = next((root / "step_00000004").glob("*.distcp"))
    middle.write_bytes(middle.read_bytes()[:100])

    tr = Trainer(tiny_config(tmp_path, *SAVE, "--checkpoint.resume=true"))
    before = _weights(tr)
    assert tr.checkpointer.resume() == 2
    err = capsys.readouterr().err
    assert "step_00000006" in err and "differ from when they were written" in err
    assert "step_00000004" in err and "bytes, the marker says" in err
    assert any(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())

    fresh = Trainer(tiny_config(tmp_path / "other", *SAVE))
    untouched = _weights(fresh)
    problem, _ = fresh.checkpointer._try_load(root / "step_00000006")
    assert "differ from when they were written" in problem
    assert all(torch.equal(untouched[k], v) for k, v in fresh.model.state_dict().items())


def test_explicit_resume_path_and_mismatches_are_clear_errors(tmp_path):
    Trainer(tiny_config(tmp_path, *SAVE)).train()
    step4 = tmp_path / "tiny" / "checkpoints" / "step_00000004"
    tr = Trainer(tiny_config(tmp_path / "b", *SAVE, f"--checkpoint.resume={step4}"))
    assert tr.checkpointer.resume() == 4
    with pytest.raises(ConfigError, match="is not a loadable checkpoint"):
        Trainer(tiny_config(tmp_path / "c", *SAVE, f"--checkpoint.resume={tmp_path}")).checkpointer.resume()
    with pytest.raises(ValueError, match="data.global_batch = 4"):
        Trainer(tiny_config(tmp_path / "d", *SAVE, "--data.global_batch=2",
                            f"--checkpoint.resume={step4}")).checkpointer.resume()
    with pytest.raises(ValueError, match="different model config"):
        Trainer(tiny_config(tmp_path / "e", *SAVE, "--model.llm.layers=2",
                            f"--checkpoint.resume={step4}")).checkpointer.resume()


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_index_that_would_run_code_is_refused(tmp_path, monkeypatch):
    Trainer(tiny_config(tmp_path, "--train.steps=2", "--checkpoint.save_every=2")).train()
    ck = tmp_path / "tiny" / "checkpoints" / "step_00000002"
    meta = read_metadata_file(ck / ".metadata")
    assert "model.language.embed_tokens.weight" in meta.state_dict_metadata
    monkeypatch.chdir(tmp_path)
    (ck / ".metadata").write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(CorruptCheckpointError, match="not allowed"):
        read_metadata_file(ck / ".metadata")
    good, bad = CheckpointStore(ck.parent, 1).scan()
    assert not good and "'.metadata' has" in bad[0].problem
    marker = json.loads((ck / MARKER).read_text())
    marker["files"][".metadata"] = {"size": (ck / ".metadata").stat().st_size, "crc32": crc32(ck / ".metadata")}
    (ck / MARKER).write_text(json.dumps(marker))
    good, bad = CheckpointStore(ck.parent, 1).scan()
    assert not good and "not allowed" in bad[0].problem
    assert not (tmp_path / "pwned.txt").exists()


def test_keep_last_k_and_stale_staging_removed(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    assert store.scan() == ([], [])
    Trainer(tiny_config(tmp_path, "--train.steps=8", "--checkpoint.save_every=2")).train()
    root = tmp_path / "tiny" / "checkpoints"
    assert _ckpts(tmp_path) == ["step_00000006", "step_00000008"]
    shutil.copytree(root / "step_00000006", root / (STAGING + "step_00000012"))
    Trainer(tiny_config(tmp_path, "--train.steps=10", "--checkpoint.save_every=2", "--checkpoint.resume=true")).train()
    assert _ckpts(tmp_path) == ["step_00000008", "step_00000010"]
