"""The checkpoint folder of a run: staged writes, atomic publication, validation and retention.

A checkpoint is written into a hidden staging folder. Only after every rank has finished writing does
rank 0 add a completion marker (listing every file and its size) and rename the folder to its public
name `step_XXXXXXXX`. A crash at any earlier moment leaves a staging folder, which is never loaded;
a published folder whose files no longer match its marker (missing, other size, other CRC-32) is
reported as corrupt and skipped. Each rank checksums the files it wrote, so no rank reads them all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

from mimo.train.checkpoint.safe_dcp import CorruptCheckpointError, read_metadata_file

MARKER = "COMPLETE.json"
STAGING = ".staging-"
_STEP = re.compile(r"^step_(\d{8})$")


def step_name(step: int) -> str:
    return f"step_{step:08d}"


@dataclass(frozen=True)
class Found:
    """One checkpoint folder: its step and, when it must not be loaded, why."""

    path: Path
    step: int
    problem: str = ""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def marker_files(path: Path) -> dict[str, dict]:
    """{relative path: {"size", "crc32"}} from a published checkpoint's marker (raises when unreadable)."""
    return {rel: dict(v) for rel, v in json.loads((path / MARKER).read_text())["files"].items()}


def folder_step(name: str) -> int:
    """The step a `step_XXXXXXXX` folder name carries, or -1."""
    m = _STEP.match(name)
    return int(m.group(1)) if m else -1


def validate(path: Path) -> str:
    """Why `path` is not a loadable checkpoint, or "" when it is: marker, file sizes, readable index.
    Cheap (no file is read in full); `verify_share` checks the contents."""
    if not (path / MARKER).is_file():
        return "no completion marker (the save never finished)"
    try:
        files = marker_files(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable completion marker ({e})"
    for rel, v in files.items():
        f = path / rel
        if not f.is_file():
            return f"file '{rel}' is missing"
        if f.stat().st_size != v.get("size"):
            return f"file '{rel}' has {f.stat().st_size} bytes, the marker says {v.get('size')}"
    try:
        read_metadata_file(path / ".metadata")
    except CorruptCheckpointError as e:
        return str(e)
    return ""


def verify_share(path: Path, part: int, parts: int) -> list[str]:
    """CRC-check every `parts`-th file of a checkpoint, starting at `part` (ranks split the reading);
    returns the files whose contents changed since they were written."""
    files = sorted(marker_files(path).items())
    return [rel for rel, v in files[part::parts] if crc32(path / rel) != v["crc32"]]


class CheckpointStore:
    """Checkpoints under `root`, newest `keep` kept. Writes happen on rank 0 only; callers synchronise."""

    def __init__(self, root: Path, keep: int):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (checkpoint.keep), got {keep}")
        self.root = Path(root)
        self.keep = keep

    def path(self, step: int) -> Path:
        return self.root / step_name(step)

    def staging(self, step: int) -> Path:
        return self.root / (STAGING + step_name(step))

    def prepare(self, step: int) -> Path:
        """Rank 0: an empty staging folder for `step` (a leftover of a crashed save is removed)."""
        tmp = self.staging(step)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def publish(self, step: int, info: dict, checksums: dict[str, int]) -> Path:
        """Rank 0, after all ranks wrote into the staging folder: add the marker, rename, prune.
        `checksums` holds the CRC-32 of the files the ranks wrote; the rest are summed here."""
        tmp = self.staging(step)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                rel = str(p.relative_to(tmp))
                files[rel] = {"size": p.stat().st_size, "crc32": checksums[rel] if rel in checksums else crc32(p)}
        marker = tmp / MARKER
        with marker.open("w") as f:
            json.dump({**info, "step": step, "files": files}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        final = self.path(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        self.prune(step)
        return final

    def scan(self) -> tuple[list[Found], list[Found]]:
        """(loadable checkpoints newest first, folders that must not be loaded with the reason)."""
        good, bad = [], []
        if not self.root.is_dir():
            return good, bad
        for p in self.root.iterdir():
            if p.name.startswith(STAGING):
                bad.append(Found(p, folder_step(p.name[len(STAGING):]), "incomplete: its save never finished"))
                continue
            step = folder_step(p.name)
            if step < 0 or not p.is_dir():
                continue
            problem = validate(p)
            (bad if problem else good).append(Found(p, step, problem))
        good.sort(key=lambda f: f.step, reverse=True)
        bad.sort(key=lambda f: f.step, reverse=True)
        return good, bad

    def prune(self, current: int) -> None:
        """Keep the `keep` newest complete checkpoints up to `current`; drop older ones, those of an abandoned
        future (steps after `current`, left by a run that was rewound), and stale staging folders."""
        good, bad = self.scan()
        kept = [f for f in good if f.step <= current][: self.keep]
        for f in good:
            if f not in kept:
                shutil.rmtree(f.path, ignore_errors=True)
        for f in bad:
            if f.path.name.startswith(STAGING):
                shutil.rmtree(f.path, ignore_errors=True)
