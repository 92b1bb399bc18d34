"""Turn a folder of images with captions into WebDataset tar shards for `data.name = "webdataset"`.

    python -m mimo.data.make_shards SRC DST [--samples-per-shard 1000]

SRC holds images (.jpg .jpeg .png .webp .bmp .gif, in sub-folders too) and, beside each, its text
with the same name: `cat.txt` (a caption) or `cat.json` (`{"caption": ...}` or chat
`{"conversations": [...]}`). DST receives `shard-000000.tar`, `shard-000001.tar`, ... with members
`<key>.<image ext>` (the original bytes, not re-encoded) and `<key>.txt` / `<key>.json`. Numbered images
without text of their own, `cat.0.jpg`, `cat.1.png`, ... beside `cat.txt`, are one sample of several images
(members `<key>.0.jpg`, `<key>.1.png`, ..., in number order). Samples go in sorted path order, so the same
folder always gives the same shards. An image without text is reported and left out. Each shard is written
under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
from pathlib import Path

from mimo.data.samples import IMAGE_EXTS


def _text_of(stem: Path) -> Path | None:
    return next((t for t in (stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".txt")) if t.is_file()),
                None)


def find_samples(src: Path) -> tuple[list[tuple[str, list[tuple[str, Path]], Path]], list[Path]]:
    """([(key, [(member suffix, image)], text file)] in sorted order, images that have no text file): an image
    with its own text is a sample (suffix `.jpg`); numbered ones (`cat.0.jpg`, `cat.1.png`) with none share `cat`'s
    text (suffixes `.0.jpg`, `.1.png`, ... in number order)."""
    groups: dict[Path, tuple[list[tuple[int, Path]], Path]] = {}
    missing = []
    for image in sorted(p for p in src.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTS):
        stem, number = image.with_suffix(""), -1
        text = _text_of(stem)
        if text is None and stem.suffix[1:].isdigit():
            stem, number = stem.with_suffix(""), int(stem.suffix[1:])
            text = _text_of(stem)
        if text is None or (stem in groups and (number < 0 or groups[stem][0][0][0] < 0)):
            missing.append(image)  # no text, or an unnumbered image and numbered ones of one name
            continue
        groups.setdefault(stem, ([], text))[0].append((number, image))
    samples = []
    for stem, (images, text) in groups.items():
        key = "/".join(part.replace(".", "_") for part in stem.relative_to(src).parts)
        ordered = sorted(images, key=lambda x: x[0])
        samples.append((key, [(f".{n}" * (number >= 0) + image.suffix.lower(), image)
                              for n, (number, image) in enumerate(ordered)], text))
    return samples, missing


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def make_shards(src: str | Path, dst: str | Path, samples_per_shard: int = 1000) -> list[Path]:
    """Write the shards; returns their paths. Raises FileNotFoundError / ValueError with the fix."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise FileNotFoundError(f"SRC '{src}' is not a folder; give the folder that holds the images and captions")
    if samples_per_shard < 1:
        raise ValueError(f"--samples-per-shard must be >= 1, got {samples_per_shard}")
    pairs, missing = find_samples(src)
    for image in missing:
        print(f"make_shards: '{image}' has no .txt or .json beside it (or is unnumbered beside numbered images of "
              "its name); left out", file=sys.stderr)
    if not pairs:
        raise ValueError(f"SRC '{src}' holds no image with a caption file (e.g. cat.jpg + cat.txt)")
    dst.mkdir(parents=True, exist_ok=True)
    shards = []
    for n, lo in enumerate(range(0, len(pairs), samples_per_shard)):
        final = dst / f"shard-{n:06d}.tar"
        tmp = final.with_name(final.name + ".tmp")
        with tarfile.open(tmp, "w") as tar:
            for key, images, text in pairs[lo : lo + samples_per_shard]:
                for suffix, image in images:
                    _add(tar, key + suffix, image.read_bytes())
                _add(tar, key + text.suffix, text.read_bytes())
        os.replace(tmp, final)
        shards.append(final)
    return shards


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mimo.data.make_shards", description=__doc__.split("\n\n")[0],
                                epilog="Then train with --data.name=webdataset --data.path=DST")
    p.add_argument("src", metavar="SRC", help="folder of images, each with a .txt or .json of the same name")
    p.add_argument("dst", metavar="DST", help="output folder for shard-XXXXXX.tar files")
    p.add_argument("--samples-per-shard", type=int, default=1000, help="samples per tar shard (default 1000)")
    args = p.parse_args(argv)
    try:
        shards = make_shards(args.src, args.dst, args.samples_per_shard)
    except (FileNotFoundError, ValueError) as e:
        print(f"make_shards: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {len(shards)} shard(s) to {args.dst}")


if __name__ == "__main__":
    main()
