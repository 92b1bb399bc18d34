"""A JSONL manifest of image and text-only samples (LLaVA-1.5's mix: captions, chats with an image, ShareGPT
chats without one) and a sample whose chat writes `<image>` but names no image file (skipped, counted), for the
real-data text-only tests on one process and on several."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from mimo.data.shapes import make_samples


def chat(*turns: str, image: bool = False) -> dict:
    """LLaVA `conversations`: human and gpt turns alternating; `image` opens the first with `<image>\\n`."""
    first = ("<image>\n" if image else "") + turns[0]
    return {"conversations": [{"from": "human" if k % 2 == 0 else "gpt", "value": t}
                              for k, t in enumerate((first, *turns[1:]))]}


def mixed_manifest(folder: Path) -> tuple[Path, list[dict]]:
    """(the manifest, its samples in line order): 0 an image with a caption (no `<image>` in the text), 1 a
    text-only chat, 2 an image with a chat that writes `<image>`, 3 a text-only caption, 4 a chat that writes
    `<image>` without an image (skipped), 5 and 6 text-only chats, 7 an image with a caption."""
    folder.mkdir(parents=True, exist_ok=True)
    image = []
    for k, shape in enumerate(make_samples(3, 5)):
        Image.fromarray(shape.images[0]).save(folder / f"i{k}.png")
        image.append(str(folder / f"i{k}.png"))
    samples = [{"image": image[0], "caption": "red"}, chat("hi", "yo"),
               {"image": image[1], **chat("what", "a box", image=True)}, {"caption": "plain"},
               chat("look", "no file", image=True), chat("why", "because"), chat("sum 2 2", "4"),
               {"image": image[2], "caption": "blue"}]
    path = folder / "mixed.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return path, samples


def data_overrides(path: Path) -> list[str]:
    return ["--data.name=jsonl", f"--data.path={path}", "--data.tokenizer=byte", "--data.seq_len=40"]
