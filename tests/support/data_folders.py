"""Data on disk in each format mimo reads (image folders, JSONL manifests), with some samples damaged on purpose."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from mimo.data.shapes import make_samples

N = 40
CORRUPT = {7, 23}  # 5% of 40


def make_folder(root: Path, corrupt: set[int] = CORRUPT) -> Path:
    """N shape images with their answer as caption; the `corrupt` ones have broken image bytes."""
    src = root / "src"
    (src / "sub").mkdir(parents=True)
    for i, s in enumerate(make_samples(N, 7)):
        folder = src / "sub" if i % 2 else src
        img = folder / f"img.{i:03d}.png"
        Image.fromarray(s.images[0]).save(img)
        if i in corrupt:
            img.write_bytes(img.read_bytes()[:40] if i % 2 else b"not an image at all")
        if i % 3 == 0:
            img.with_suffix(".json").write_text(json.dumps({"conversations": [
                {"from": "human", "value": f"<image>\n{s.question}"}, {"from": "gpt", "value": s.answer}]}))
        else:
            img.with_suffix(".txt").write_text(s.answer)
    Image.fromarray(make_samples(1, 1)[0].images[0]).save(src / "no_caption.png")
    return src


def data_overrides(name: str, path: Path, *extra: str) -> list[str]:
    """A real-data run; rows hold a chat in LLaVA-1.5's format (data.prompt_format = "chat") or a caption."""
    return [f"--data.name={name}", f"--data.path={path}", "--data.global_batch=8", "--data.seq_len=64", *extra]


def write_manifest(root: Path, captions: dict[int, str]) -> Path:
    """A JSONL manifest of make_folder's N images (samples 7 and 23 have broken image bytes), with the
    caption of sample i replaced by captions[i]."""
    make_folder(root)
    lines = []
    for i in range(N):
        folder = "src/sub" if i % 2 else "src"
        caption = captions.get(i, f"shape {i}")
        lines.append(json.dumps({"image": f"{folder}/img.{i:03d}.png", "caption": caption}))
    path = root / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
