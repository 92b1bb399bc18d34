"""LLaVA-Pretrain as it is downloaded: one .json array of samples beside an images/ folder, written small."""

from __future__ import annotations

import json

from PIL import Image

from mimo.data.shapes import make_samples

N = 16


def make_llava_pretrain(root):
    """root/LLaVA-Pretrain/{blip_laion_cc_sbu_558k.json, images/0000k/*.jpg}, one sample without an image
    (a text-only sample)."""
    base = root / "LLaVA-Pretrain"
    items = []
    for i, s in enumerate(make_samples(N, 3)):
        name = f"{i // 8:05d}/{i:09d}.jpg"
        (base / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(s.images[0]).save(base / "images" / name)
        items.append({"id": f"{i:09d}", "image": name, "conversations": [
            {"from": "human", "value": f"{s.question}\n<image>"}, {"from": "gpt", "value": s.answer}]})
    items.append({"id": "no_image", "conversations": [{"from": "gpt", "value": "x"}]})
    (base / "blip_laion_cc_sbu_558k.json").write_text(json.dumps(items))
    return base
