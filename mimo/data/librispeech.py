"""A LibriSpeech-style folder -> a JSONL manifest of {"audio": ..., "text": ...} for data.name = "jsonl".

The layout: `<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac` beside one
`<speaker>-<chapter>.trans.txt` per chapter whose lines are `<utterance id> <TRANSCRIPT>`. Audio paths in
the manifest are relative to its folder. `python -m mimo.data.librispeech LibriSpeech/train-clean-100
train.jsonl [--lowercase]`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mimo.data.samples import AUDIO_EXTS


def transcripts(root: Path) -> list[tuple[Path, str]]:
    """(clip path, transcript) for every utterance a .trans.txt under `root` names, sorted by clip path;
    raises FileNotFoundError when `root` holds none."""
    out = []
    for listing in sorted(root.rglob("*.trans.txt")):
        for line in listing.read_text(encoding="utf-8").splitlines():
            utterance, _, text = line.strip().partition(" ")
            clips = [listing.parent / f"{utterance}{ext}" for ext in AUDIO_EXTS]
            found = next((c for c in clips if c.is_file()), None)
            if utterance and found is not None:
                out.append((found, text.strip()))
    if not out:
        raise FileNotFoundError(f"'{root}' holds no *.trans.txt naming a clip beside it; give a LibriSpeech split "
                                "folder such as LibriSpeech/train-clean-100")
    return sorted(out)


def write_manifest(root: str | Path, out: str | Path, lowercase: bool = False) -> int:
    """Write the manifest of `root`'s utterances to `out`; the number of lines written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"audio": os.path.relpath(clip, out.parent), "text": text.lower() if lowercase else text}
            for clip, text in transcripts(Path(root))]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mimo.data.librispeech", description=__doc__)
    p.add_argument("root", help="a LibriSpeech split folder, e.g. LibriSpeech/train-clean-100")
    p.add_argument("out", help="the .jsonl manifest to write")
    p.add_argument("--lowercase", action="store_true", help="lowercase the (upper-case) transcripts")
    args = p.parse_args(argv)
    try:
        n = write_manifest(args.root, args.out, args.lowercase)
    except FileNotFoundError as e:
        print(f"mimo: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {n} utterances to {args.out}")


if __name__ == "__main__":
    main()
