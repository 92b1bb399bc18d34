"""Turn a folder of images with captions into WebDataset tar shards for `data.name = "webdataset"`.

    python -m mimo.data.make_shards SRC DST [--samples-per-shard 1000]

SRC holds images (.jpg .jpeg .png .webp .bmp .gif, in sub-folders too) and, beside each, its text
with the same name: `cat.txt` (a caption) or `cat.json` (`{"caption": ...}` or chat
`{"conversations": [...]}`). DST receives `shard-000000.tar`, `shard-000001.tar`, ... with members
`<key>.<image ext>` (the original bytes, not re-encoded) and `<key>.txt` / `<key>.json`. Samples
go in sorted path order, so the same folder always gives the same shards. An image without text is
reported and left out. Each shard is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
from pathlib import Path

from mimo.data.samples import IMAGE_EXTS


def find_samples(src: Path) -> tuple[list[tuple[str, Path, Path]], list[Path]]:
    """([(key, image, text file)] in sorted order, images that have no text file)."""
    pairs, missing = [], []
    for image in sorted(p for p in src.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTS):
        text = next((t for t in (image.with_suffix(".json"), image.with_suffix(".txt")) if t.is_file()), None)
        if text is None:
            missing.append(image)
            continue
        rel = image.relative_to(src).with_suffix("")
        key = "/".join(part.replace(".", "_") for part in rel.parts)
        pairs.append((key, image, text))
    return pairs, missing


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
        print(f"make_shards: '{image}' has no .txt or .json beside it; left out", file=sys.stderr)
    if not pairs:
        raise ValueError(f"SRC '{src}' holds no image with a caption file (e.g. cat.jpg + cat.txt)")
    dst.mkdir(parents=True, exist_ok=True)
    shards = []
    for n, lo in enumerate(range(0, len(pairs), samples_per_shard)):
        final = dst / f"shard-{n:06d}.tar"
        tmp = final.with_name(final.name + ".tmp")
        with tarfile.open(tmp, "w") as tar:
            for key, image, text in pairs[lo : lo + samples_per_shard]:
                _add(tar, key + image.suffix.lower(), image.read_bytes())
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
