"""Several images of one WebDataset sample (numbered members `key.0.png`, `key.1.png`, ...): an anyres run and a
native-resolution one read them as a JSONL manifest's `"image": [...]` list, giving the same batch tensors;
misnumbered images are a skipped sample."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from mimo.config.load import load_config
from mimo.data.make_shards import find_samples, make_shards
from mimo.data.webdataset import read_shard
from mimo.train.trainer import Trainer
from tests.support.anyres_data import SIZES, jsonl
from tests.support.configs import CONFIGS
from tests.support.native_data import TINY, write_image
from tests.support.tiny_run import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

SAMPLES = [("s0", [0], "picture 0"), ("s1", [1, 3], "two"), ("s2", [4, 2, 0], "three of them")]
"""(key, indices into SIZES of its images in order, caption): s0 a plain `s0.png`, the others numbered images."""


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_both(tmp_path: Path) -> tuple[str, str]:
    """SAMPLES as a JSONL manifest (image lists, s0's a plain path) and as the shards make_shards writes of a folder
    of `s0.png`, `s1.0.png`, `s1.1.png`, ... beside `s0.txt`, `s1.txt`, ..."""
    paths = [Path(write_image(tmp_path / f"i{k}.png", s, k)) for k, s in enumerate(SIZES)]
    lines = [{"image": [str(paths[k]) for k in images] if len(images) > 1 else str(paths[images[0]]), "caption": text}
             for _, images, text in SAMPLES]
    manifest = tmp_path / "lists.jsonl"  # beside tests.unit.test_anyres_data's m.jsonl
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    src = tmp_path / "src"
    src.mkdir()
    for key, images, text in SAMPLES:
        for n, k in enumerate(images):
            shutil.copy(paths[k], src / (f"{key}.{n}.png" if len(images) > 1 else f"{key}.png"))
        (src / f"{key}.txt").write_text(text)
    make_shards(src, tmp_path / "shards")
    return str(manifest), str(tmp_path / "shards")


def batch_of(tmp_path: Path, kind: str, name: str, path: str) -> dict:
    """Rows 0..2 of `name` data at `path` assembled for an anyres or a native-resolution run."""
    data = [f"--data.name={name}", f"--data.path={path}"]
    if kind == "anyres":
        cfg = tiny_config(tmp_path / name, *jsonl(tmp_path), *data, "--data.seq_len=96")
    else:
        cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, *data, f"--run.out_dir={tmp_path / name}"])
    trainer = Trainer(cfg)
    reader = trainer.data.reader(trainer.data)
    n = len(SAMPLES)
    return trainer.data._assemble([reader[(r, r, True, frozenset({"images"}))] for r in range(n)], n,
                                  torch.zeros(n, dtype=torch.bool))


def leaves(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for k, v in tree.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


@pytest.mark.parametrize("kind", ["anyres", "native"])
def test_numbered_images_read_as_the_manifest_list_does(tmp_path, kind):
    manifest, shard = write_both(tmp_path)
    records, problem = read_shard(Path(shard) / "shard-000000.tar")
    assert problem == "" and [len(r.images) for r in records] == [0, 2, 3] and records[0].image is not None
    got, ref = (leaves(batch_of(tmp_path, kind, *source)) for source in (("webdataset", shard), ("jsonl", manifest)))
    assert got["modality_counts.images"].tolist() == [1, 2, 3] and got.keys() == ref.keys()
    for key, value in got.items():
        assert torch.equal(value, ref[key]), key
    sizes = [list(SIZES[k]) for _, images, _ in SAMPLES for k in images]
    if kind == "anyres":
        assert got["modality_inputs.images.vit.image_sizes"].tolist() == sizes
    else:
        assert got["modality_inputs.images.visual.grid_thw"].shape[0] == len(sizes)


@pytest.mark.parametrize(("names", "numbers"), [(["k.0.png", "k.2.png"], "[0, 2] beside 0"),
                                                (["k.png", "k.0.png"], "[0] beside 1"),
                                                (["k.0.png", "k.0.jpg"], "[0, 0] beside 0")])
def test_misnumbered_images_are_a_skipped_sample(tmp_path, names, numbers):
    shard = write_tar(tmp_path / "s.tar", [(n, b"x") for n in names] + [("k.txt", b"a caption")])
    (record,), problem = read_shard(shard)
    assert problem == "" and f"numbers its images {numbers} unnumbered; name several images" in record.problem


def test_make_shards_numbers_images_that_share_a_caption(tmp_path):
    """`a.0.png`, `a.1.png` beside `a.txt` are one sample of two (in number order, 10 before 2 read as numbers);
    `b.2023.png` beside its own `b.2023.txt` stays a plain image; an unnumbered `a.png` beside `a`'s numbered ones
    and `c.0.png` without `c.txt` are left out."""
    for name in ("a.10.png", "a.2.png", "a.png", "b.2023.png", "c.0.png"):
        write_image(tmp_path / name, (8, 8), 0)
    for name in ("a.txt", "b.2023.txt"):
        (tmp_path / name).write_text("x")
    samples, missing = find_samples(tmp_path)
    assert [(key, [(suffix, image.name) for suffix, image in images]) for key, images, _ in samples] == [
        ("a", [(".0.png", "a.2.png"), (".1.png", "a.10.png")]), ("b_2023", [(".png", "b.2023.png")])]
    assert [p.name for p in missing] == ["a.png", "c.0.png"]
