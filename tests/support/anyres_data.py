"""Any-resolution (LLaVA-NeXT-style) image data for tests: a manifest of odd-sized images and its overrides."""

from __future__ import annotations

import json

from tests.support.anyres_run import ANYRES
from tests.support.native_data import write_image

SIZES = [(20, 40), (40, 24), (12, 44), (33, 33), (50, 17)]  # (height, width)


def manifest(tmp_path) -> str:
    """Images of SIZES one a sample, then two images (20 x 40, 40 x 24), text alone, a missing image and a video
    (both skipped and counted)."""
    paths = [write_image(tmp_path / f"i{k}.png", s, k) for k, s in enumerate(SIZES)]
    lines = [{"image": p, "caption": f"picture {k}"} for k, p in enumerate(paths)]
    lines += [{"image": paths[:2], "caption": "two"}, {"image": [], "caption": "none"},
              {"image": str(tmp_path / "missing.png"), "caption": "gone"},
              {"video": paths[3:], "fps": 1.0, "caption": "clip"}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def jsonl(tmp_path) -> list[str]:
    return [*ANYRES, "--data.name=jsonl", f"--data.path={manifest(tmp_path)}", "--data.tokenizer=byte",
            "--data.seq_len=64"]
