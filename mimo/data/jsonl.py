"""JSONL manifests: one JSON object per line naming an image file and its text; or a .json file holding
one array of such objects (the LLaVA-Pretrain / LLaVA-Instruct layout).

`{"image": "imgs/0001.jpg", "caption": "a red circle"}`, or with chat turns
`{"image": ..., "conversations": [{"from": "human", "value": "<image>\\nwhat?"}, {"from": "gpt", ...}]}`
(`"messages"` with role/content works too); `"video": ["f0.jpg", "f1.jpg", ...]` (with `"fps"`, default 2)
names a video's frames for native-resolution models, as `"image": ["a.jpg", "b.png"]` names several images of one
sample (`[]`: none, a text-only sample); `"audio": "clips/1.flac"` names a clip (relative to the
manifest's folder), alone with its transcript (`"text"`) or beside an image. A sample with none of these
(LLaVA's ShareGPT conversations) is a text-only sample, unless its text writes `<image>` (or `<audio>`): then it
is skipped and counted, its file missing. Relative image paths start
from `image_root` (data.image_root), by default the manifest's folder. A line that is not valid JSON
becomes a skipped sample, counted like an unreadable image; a .json file that is not one array of objects
is refused whole.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from mimo.config.schema import ConfigError
from mimo.data.samples import ImageRef, Record, record_from_json, resolve_image_path, text_only_checked


def read_manifest(path: str | Path, field: str = "data.path", image_root: str = "") -> tuple[list[Record], list[str]]:
    """The records of a manifest, one per non-blank line (keyed `line N`) or per array item of a .json file
    (keyed `item N`), and file-level problems. `field` is the config key that named the manifest, for the
    error; `image_root` the folder relative image paths start from ("" = the manifest's folder)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{field} = '{p}' is not a file; give the path of a .jsonl manifest or a .json array")
    root = Path(image_root) if image_root else p.parent
    if p.suffix == ".json":
        return [_record(f"item {n}", meta, root, f"{p} item {n}", p.parent)
                for n, meta in enumerate(_json_array(p, field))], []
    records = []
    with p.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                meta = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                records.append(Record(f"line {n}", problem=f"{p}:{n} is not valid JSON ({e})"))
                continue
            records.append(_record(f"line {n}", meta, root, f"{p}:{n}", p.parent))
    return records, []


def _json_array(p: Path, field: str) -> list:
    try:
        items = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{field} = '{p}' is not valid JSON ({e}); a .json manifest is one array of objects") from e
    if not isinstance(items, list):
        raise ConfigError(f"{field} = '{p}' holds a {type(items).__name__}, not an array of samples; a .json manifest "
                         "is one array of objects (or use a .jsonl file, one object per line)")
    return items


def _record(key: str, meta: object, root: Path, where: str, folder: Path) -> Record:
    """A record of one sample object: its image path (or video frames) from `root`, its audio path from the
    manifest's `folder`."""
    image = meta.get("image") if isinstance(meta, dict) else None
    audio = meta.get("audio") if isinstance(meta, dict) else None
    video = meta.get("video") if isinstance(meta, dict) else None
    if video is not None:
        fps = meta.get("fps", 2.0)
        if not (isinstance(video, list) and video and all(isinstance(v, str) for v in video)):
            return Record(key, problem=f'{where}: "video" must be a non-empty list of frame image paths')
        if not isinstance(fps, (int, float)) or fps <= 0:
            return Record(key, problem=f'{where}: "fps" must be a positive number of frames per second')
        rec = record_from_json(key, meta, None)
        return replace(rec, frames=tuple(ImageRef(str(resolve_image_path(root, v))) for v in video), fps=float(fps))
    if isinstance(image, list):
        if not all(isinstance(v, str) for v in image) or audio is not None:
            return Record(key, problem=f'{where}: "image" as a list must name image paths (none: a text-only '
                                       'sample), and no "audio"')
        return text_only_checked(replace(record_from_json(key, meta, None), images=tuple(
            ImageRef(str(resolve_image_path(root, v))) for v in image)), where)
    wrong = next((k for k, v in (("image", image), ("audio", audio)) if v is not None and not isinstance(v, str)), None)
    if wrong:
        return Record(key, problem=f'{where}: "{wrong}" must be a file path (leave it out for a text-only sample)')
    return text_only_checked(record_from_json(
        key, meta, ImageRef(str(resolve_image_path(root, image))) if isinstance(image, str) else None,
        ImageRef(str(resolve_image_path(folder, audio))) if isinstance(audio, str) else None), where)
