"""An explicit checkpoint.resume that cannot be loaded stops the run naming the file and why, and leaves the run
folder exactly as it was (no metrics truncated, no checkpoint pruned, no config rewritten). A state.json whose
step disagrees with its completion marker is damaged like any other (checkpoint.resume = true sets it aside and
continues from the one before); a checkpoint past train.steps is refused, the folder left as it was."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from mimo.cli import main
from mimo.config.schema import ConfigError
from mimo.train.checkpoint.store import MARKER, crc32
from mimo.train.trainer import Trainer
from tests.support.tiny_run import DEMO, TINY, metrics, tiny_config

SAVE = ["--train.steps=6", "--checkpoint.save_every=2"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _reseal(ckpt: Path) -> None:
    """Rewrite the completion marker for the files as they are now (an attacker who knows the format)."""
    marker = json.loads((ckpt / MARKER).read_text())
    for rel in marker["files"]:
        marker["files"][rel] = {"size": (ckpt / rel).stat().st_size, "crc32": crc32(ckpt / rel)}
    (ckpt / MARKER).write_text(json.dumps(marker))


@pytest.fixture
def run(tmp_path) -> Path:
    Trainer(tiny_config(tmp_path, *SAVE)).train()
    return tmp_path / "tiny"


def _refused(tmp_path: Path, ckpt: Path, match: str) -> None:
    before = _snapshot(ckpt.parents[1])
    tr = Trainer(tiny_config(tmp_path, *SAVE, f"--checkpoint.resume={ckpt}"))
    with pytest.raises(ConfigError, match=match) as err:
        tr.train()
    assert "nothing in the run folder was changed" in str(err.value).lower()
    assert _snapshot(ckpt.parents[1]) == before


def test_a_shard_that_fails_its_crc_is_refused_and_the_run_folder_untouched(tmp_path, run):
    ckpt = run / "checkpoints" / "step_00000006"
    shard = max(ckpt.glob("*.distcp"), key=os.path.getsize)
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    _refused(tmp_path, ckpt, rf"cannot be loaded: .*{shard.name}.* differ from when they were written")


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_a_torch_save_payload_is_refused_and_the_run_folder_untouched(tmp_path, run, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = run / "checkpoints" / "step_00000006"
    for shard in ckpt.glob("*.distcp"):
        with shard.open("wb") as f:
            torch.save({"x": _Boom()}, f, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    _reseal(ckpt)
    _refused(tmp_path, ckpt, r"cannot be loaded: its tensors in \['__0_0.distcp'\] failed to load \(rank 0: \w+Error: ")
    assert not (tmp_path / "pwned.txt").exists()


def test_a_missing_shard_is_refused_and_the_run_folder_untouched(tmp_path, run):
    ckpt = run / "checkpoints" / "step_00000006"
    shard = next(ckpt.glob("*.distcp"))
    shard.unlink()
    _refused(tmp_path, ckpt, rf"not a loadable checkpoint \(file '{shard.name}' is missing\)")


def test_a_garbled_state_file_is_refused_and_the_run_folder_untouched(tmp_path, run):
    ckpt = run / "checkpoints" / "step_00000006"
    state = ckpt / "state.json"
    size = state.stat().st_size
    state.write_text(json.dumps([0]).ljust(size))  # valid JSON, not an object; same size
    _reseal(ckpt)
    _refused(tmp_path, ckpt, r"state.json' has no next_step")


def _restep(ckpt: Path, step: int) -> None:
    """state.json's next_step set to `step`, its checksums rewritten to match."""
    state = json.loads((ckpt / "state.json").read_text())
    (ckpt / "state.json").write_text(json.dumps({**state, "next_step": step}))
    _reseal(ckpt)


@pytest.mark.parametrize("step", [-3, 1000000, 4])
def test_a_state_step_the_marker_does_not_record_is_refused(tmp_path, run, step):
    ckpt = run / "checkpoints" / "step_00000006"
    _restep(ckpt, step)
    _refused(tmp_path, ckpt, rf"state.json' says next_step {step}, but its completion marker says step 6 and its "
                             "folder name 6")


@pytest.mark.parametrize("step", [-3, 1000000])
def test_resume_sets_a_checkpoint_with_a_false_step_aside_and_continues_from_the_one_before(tmp_path, run, step,
                                                                                           capsys):
    ckpt = run / "checkpoints" / "step_00000006"
    _restep(ckpt, step)
    damaged = _snapshot(ckpt)
    summary = Trainer(tiny_config(tmp_path, "--train.steps=8", "--checkpoint.save_every=2",
                                  "--checkpoint.resume=true")).train()
    err = capsys.readouterr().err
    assert f"ignoring '{ckpt}': '{ckpt / 'state.json'}' says next_step {step}" in err
    assert "resumed from" in err and "step_00000004' at step 4" in err
    assert [r["step"] for r in metrics(tmp_path)] == list(range(8)) and summary["steps"] == 8
    assert _snapshot(run / "checkpoints" / "step_00000006.damaged") == damaged


def test_a_checkpoint_past_train_steps_is_refused_and_the_run_folder_untouched(tmp_path, run):
    before = _snapshot(run)
    with pytest.raises(ConfigError, match=r"after step 6, past this run's train.steps = 4.*--train.steps=6"):
        Trainer(tiny_config(tmp_path, "--train.steps=4", "--checkpoint.resume=true")).train()
    assert _snapshot(run) == before


def test_a_garbled_rng_file_is_refused_and_the_run_folder_untouched(tmp_path, run):
    ckpt = run / "checkpoints" / "step_00000006"
    rng = ckpt / "rng" / "rank_00000.json"
    rng.write_text(json.dumps({"torch": "AAAA", "numpy": {}, "python": {}}))
    _reseal(ckpt)
    _refused(tmp_path, ckpt, r"rank_00000.json' is unreadable \(not an RNG state")


def test_cli_prints_one_error_line_and_exits_2(tmp_path, run, capsys):
    ckpt = run / "checkpoints" / "step_00000006"
    next(ckpt.glob("*.distcp")).unlink()
    with pytest.raises(SystemExit) as e:
        main(["train", str(DEMO), *TINY, f"--run.out_dir={tmp_path}", *SAVE, f"--checkpoint.resume={ckpt}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("mimo: error: checkpoint.resume = ")
