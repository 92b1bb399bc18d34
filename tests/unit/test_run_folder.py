"""A run folder that holds another run, or a live one, is refused unless the run continues it or says
run.overwrite = true; a run never overwrites or prunes checkpoints it did not start from."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from mimo.cli import main
from mimo.config.schema import ConfigError
from mimo.train.checkpoint.resume import RunCheckpointer
from mimo.train.trainer import Trainer
from tests.support.tiny_run import DEMO, TINY, metrics, tiny_config

SAVE = ["--train.steps=6", "--checkpoint.save_every=2"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run(tmp_path) -> Path:
    Trainer(tiny_config(tmp_path, *SAVE)).train()
    return tmp_path / "tiny"


def _refused(tmp_path: Path, *overrides: str, match: str) -> None:
    before = _snapshot(tmp_path / "tiny")
    with pytest.raises(ConfigError, match=match):
        Trainer(tiny_config(tmp_path, *overrides)).train()
    assert _snapshot(tmp_path / "tiny") == before


def test_a_second_run_of_the_same_name_is_refused_and_changes_nothing(tmp_path, run):
    _refused(tmp_path, "--train.steps=2", match=r"holds another run \(config.toml, metrics.jsonl, summary.json.*"
             r"--checkpoint.resume=true.*--run.overwrite=true")


def test_overwrite_deletes_the_old_run_and_starts_over(tmp_path, run):
    Trainer(tiny_config(tmp_path, "--train.steps=3", "--run.overwrite=true")).train()
    assert [r["step"] for r in metrics(tmp_path)] == [0, 1, 2]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000003"]  # only the new run's final weights


def test_resume_with_nothing_to_load_does_not_start_over_on_another_run(tmp_path):
    Trainer(tiny_config(tmp_path, "--train.steps=2")).train()
    shutil.rmtree(tmp_path / "tiny" / "checkpoints")  # its final weights gone: nothing to load
    _refused(tmp_path, "--train.steps=4", "--checkpoint.resume=true", match="no checkpoint to continue it from")


class Killed(Exception):
    pass


def test_resume_after_a_kill_before_the_first_checkpoint_says_what_to_do_in_one_line(tmp_path, monkeypatch, capsys):
    def killed(self: RunCheckpointer, step: int) -> bool:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(RunCheckpointer, "after_step", killed)
        with pytest.raises(Killed):
            Trainer(tiny_config(tmp_path, "--train.steps=4", "--checkpoint.save_every=2")).train()
    assert not (tmp_path / "tiny" / "checkpoints").exists() and metrics(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", str(DEMO), *TINY, f"--run.out_dir={tmp_path}", "--train.steps=4", "--checkpoint.resume=true"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("mimo: error: run folder ") and err.count("\n") == 1, err
    assert "no checkpoint to continue it from" in err and "--run.overwrite=true" in err
    assert "starting at step 0" not in err


def test_a_live_run_holds_the_folder(tmp_path, run):
    fd = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _refused(tmp_path, *SAVE, "--checkpoint.resume=true", match="in use by another running `mimo train`")
    finally:
        os.close(fd)
    Trainer(tiny_config(tmp_path, "--train.steps=8", "--checkpoint.save_every=2", "--checkpoint.resume=true")).train()
    fd = os.open(run, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released after the run
    os.close(fd)


def test_a_checkpoint_of_another_run_starts_a_new_folder_only(tmp_path, run):
    ckpt = run / "checkpoints" / "step_00000004"
    other = tmp_path / "other"
    Trainer(tiny_config(other, *SAVE)).train()
    before = _snapshot(other / "tiny")
    with pytest.raises(ConfigError, match="is a checkpoint of another folder"):
        Trainer(tiny_config(other, *SAVE, f"--checkpoint.resume={ckpt}")).train()
    assert _snapshot(other / "tiny") == before
    fresh = tmp_path / "fresh"
    Trainer(tiny_config(fresh, *SAVE, f"--checkpoint.resume={ckpt}")).train()
    assert [r["step"] for r in metrics(fresh)] == [4, 5]
    assert (ckpt / "COMPLETE.json").is_file()


def test_rewinding_needs_overwrite(tmp_path, run):
    ckpt = run / "checkpoints" / "step_00000004"
    _refused(tmp_path, *SAVE, f"--checkpoint.resume={ckpt}", match=r"rewinds the run .*\['step_00000006'\]")
    Trainer(tiny_config(tmp_path, *SAVE, f"--checkpoint.resume={ckpt}", "--run.overwrite=true")).train()
    assert [r["step"] for r in metrics(tmp_path)] == list(range(6))


def test_a_damaged_newest_checkpoint_is_set_aside_not_replaced(tmp_path, run):
    newest = run / "checkpoints" / "step_00000006"
    shard = next(newest.glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    damaged = _snapshot(newest)
    Trainer(tiny_config(tmp_path, *SAVE, "--checkpoint.resume=true")).train()
    assert [r["step"] for r in metrics(tmp_path)] == list(range(6))
    assert _snapshot(run / "checkpoints" / "step_00000006.damaged") == damaged
    assert json.loads((newest / "COMPLETE.json").read_text())["reason"] == "periodic"


def test_cli_refuses_a_reused_run_name_with_one_line(tmp_path, run, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", str(DEMO), *TINY, f"--run.out_dir={tmp_path}", "--train.steps=2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("mimo: error: run folder ") and err.count("\n") == 1


def test_a_folder_that_cannot_be_locked_runs_with_a_warning(tmp_path, monkeypatch, capsys):
    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    Trainer(tiny_config(tmp_path, "--train.steps=2")).train()
    assert "mimo: warning: cannot lock run folder" in capsys.readouterr().err
    assert [r["step"] for r in metrics(tmp_path)] == [0, 1]


def test_resuming_a_run_saved_before_prompt_formats_keeps_its_format(tmp_path, run):
    saved = run / "config.toml"
    saved.write_text("\n".join(line for line in saved.read_text().splitlines() if not line.startswith("prompt_format")))
    _refused(tmp_path, "--train.steps=8", "--checkpoint.resume=true",
             match=r'trained with data.prompt_format = "plain"; continuing it with "chat".*--data.prompt_format=plain')
    Trainer(tiny_config(tmp_path, "--train.steps=8", "--checkpoint.resume=true", "--data.prompt_format=plain")).train()
    assert [r["step"] for r in metrics(tmp_path)][-2:] == [6, 7]
