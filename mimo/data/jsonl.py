"""JSONL manifests: one JSON object per line naming an image file and its text.

`{"image": "imgs/0001.jpg", "caption": "a red circle"}`, or with chat turns
`{"image": ..., "conversations": [{"from": "human", "value": "<image>\\nwhat?"}, {"from": "gpt", ...}]}`
(`"messages"` with role/content works too). Relative image paths are relative to the manifest's
folder. A line that is not valid JSON becomes a skipped sample, counted like an unreadable image.
"""

from __future__ import annotations

import json
from pathlib import Path

from mimo.data.samples import ImageRef, Record, record_from_json, resolve_image_path


def read_manifest(path: str | Path, field: str = "data.path") -> tuple[list[Record], list[str]]:
    """The records of a manifest, one per non-blank line (keyed `line N`), and file-level problems.
    `field` is the config key that named the manifest, for the error."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{field} = '{p}' is not a file; give the path of a .jsonl manifest")
    records = []
    with p.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            key = f"line {n}"
            try:
                meta = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                records.append(Record(key, problem=f"{p}:{n} is not valid JSON ({e})"))
                continue
            name = meta.get("image") if isinstance(meta, dict) else None
            if not isinstance(name, str):
                records.append(Record(key, problem=f'{p}:{n} has no "image" path'))
                continue
            records.append(record_from_json(key, meta, ImageRef(str(resolve_image_path(p.parent, name)))))
    return records, []
