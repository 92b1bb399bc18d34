"""WebDataset-style tar shards: samples are runs of tar members sharing a key, `key.<ext>`.

A sample holds one image (`.jpg`, `.png`, ...) and/or one clip (`.wav`, `.flac`, ...) and its text:
`key.txt` (a caption or transcript) or `key.json` (`{"caption": ...}`, LLaVA `{"conversations": [...]}` or
chat `{"messages": [...]}`). Several images of one sample (for native-resolution and anyres models, as a JSONL
`"image": [...]` list) are numbered members `key.0.jpg`, `key.1.png`, ..., in that order. A sample of text alone
is a text-only sample (skipped and counted if its text writes `<image>` or `<audio>`). Indexing reads tar headers
and the small text members only; images and clips stay in the shard and are read later by offset, so any sample
can be fetched directly (a deterministic, resumable order needs no streaming).
A shard that is cut short keeps the samples before the damage; the damage is reported.
"""

from __future__ import annotations

import json
import re
import tarfile
from dataclasses import replace
from pathlib import Path

from mimo.data.samples import AUDIO_EXTS, IMAGE_EXTS, ImageRef, Record, record_from_json, text_only_checked

_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def shard_paths(spec: str, field: str = "data.path") -> list[Path]:
    """The shards `spec` names: one .tar file, a folder of them (sorted), or a brace range such as
    `data/shard-{000000..000009}.tar`. `field` is the config key that named them, for the error."""
    m = _BRACES.search(spec)
    if m:
        lo, hi = m.group(1), m.group(2)
        paths = [Path(spec[: m.start()] + str(i).zfill(len(lo)) + spec[m.end():]) for i in range(int(lo), int(hi) + 1)]
    else:
        p = Path(spec)
        paths = sorted(p.glob("*.tar")) if p.is_dir() else [p]
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing:
        raise FileNotFoundError(f"{field} = '{spec}' names no tar shard{'s ' + str(missing[:3]) if missing else ''}; "
                                "give a .tar file, a folder of .tar files or a brace range like shard-{000..009}.tar")
    return paths


def _split(name: str) -> tuple[str, str]:
    """Tar member name -> (sample key, extension): the extension starts at the first dot of the basename."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (dot + ext).lower()


def _ends_cleanly(path: Path, end: int) -> bool:
    """A tar ends with at least two zero blocks after its last member; a cut-off one does not."""
    with path.open("rb") as f:
        f.seek(end)
        tail = f.read()
    return len(tail) >= 2 * tarfile.BLOCKSIZE and not tail.strip(b"\0")


def read_shard(path: Path) -> tuple[list[Record], str]:
    """(records of one shard in member order, a problem description or "")."""
    groups: dict[str, dict[str, tarfile.TarInfo]] = {}
    texts: dict[str, dict[str, bytes]] = {}
    end = 0
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                if not member.isfile():
                    continue
                key, ext = _split(member.name)
                groups.setdefault(key, {})[ext] = member
                if ext in (".txt", ".json"):
                    f = tar.extractfile(member)
                    texts.setdefault(key, {})[ext] = f.read() if f else b""
        clean = _ends_cleanly(path, end)
        problem = "" if clean else f"shard '{path}' is cut short or damaged after {len(groups)} samples"
    except (tarfile.TarError, OSError, EOFError) as e:
        problem = f"shard '{path}' is damaged after {len(groups)} samples ({e})"
    return [_record(str(path), key, members, texts.get(key, {})) for key, members in groups.items()], problem


def _numbered_images(members: dict[str, tarfile.TarInfo]) -> list[tuple[int, tarfile.TarInfo]]:
    """A sample's `key.<n>.<image ext>` members as (n, member), by n."""
    found = []
    for ext, member in members.items():
        number, dot, rest = ext[1:].partition(".")
        if number.isdigit() and dot and f".{rest}" in IMAGE_EXTS:
            found.append((int(number), member))
    return sorted(found, key=lambda x: x[0])


def _record(path: str, key: str, members: dict[str, tarfile.TarInfo], texts: dict[str, bytes]) -> Record:
    """A sample's record: one image, or several numbered ones (`images`, `image` None), and/or a clip."""
    images = [m for ext, m in members.items() if ext in IMAGE_EXTS]
    numbered = _numbered_images(members)
    clips = [m for ext, m in members.items() if ext in AUDIO_EXTS]
    image = ImageRef(path, images[0].offset_data, images[0].size) if images else None
    audio = ImageRef(path, clips[0].offset_data, clips[0].size) if clips else None
    where = f"sample '{key}' in '{path}'"
    if numbered and (images or [n for n, _ in numbered] != list(range(len(numbered)))):
        return Record(key, problem=f"{where} numbers its images {[n for n, _ in numbered]} beside {len(images)} "
                                   "unnumbered; name several images of a sample key.0.<ext>, key.1.<ext>, ...")
    several = tuple(ImageRef(path, m.offset_data, m.size) for _, m in numbered)
    try:
        if ".json" in texts:
            rec = record_from_json(key, json.loads(texts[".json"].decode("utf-8")), image, audio)
        elif ".txt" in texts:
            rec = Record(key, image, caption=texts[".txt"].decode("utf-8").strip(), audio=audio)
        else:
            return Record(key, image, problem=f"{where} has no .txt or .json member")
    except (UnicodeDecodeError, ValueError) as e:
        return Record(key, image, problem=f"{where} has unreadable text ({e})")
    return text_only_checked(replace(rec, images=several) if several else rec, where)


def read_webdataset(spec: str, field: str = "data.path") -> tuple[list[Record], list[str]]:
    """All records of the shards `spec` names, in shard then member order, and the shard problems."""
    records, problems = [], []
    for path in shard_paths(spec, field):
        recs, problem = read_shard(path)
        records.extend(recs)
        if problem:
            problems.append(problem)
    return records, problems
