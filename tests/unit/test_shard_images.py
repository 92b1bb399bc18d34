"""Several images of one WebDataset sample (numbered members `key.0.png`, `key.1.png`, ...): an anyres run and a
native-resolution one read them as a JSONL manifest's `"image": [...]` list, giving the same batch tensors;
misnumbered images are a skipped sample."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

from mimo.config.load import load_config
from mimo.data.webdataset import read_shard
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.tiny_run import tiny_config
from tests.unit.test_anyres_data import SIZES, jsonl
from tests.unit.test_native_data import TINY, write_image

pytestmark = pytest.mark.usefixtures("one_thread")

SAMPLES = [("one", [0], "picture 0"), ("two", [1, 3], "two"), ("three", [4, 2, 0], "three of them")]
"""(key, indices into SIZES of its images in order, caption)."""


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_both(tmp_path: Path) -> tuple[str, str]:
    """SAMPLES as a JSONL manifest of image lists and as one shard of numbered members (in the same order)."""
    paths = [Path(write_image(tmp_path / f"i{k}.png", s, k)) for k, s in enumerate(SIZES)]
    lines = [{"image": [str(paths[k]) for k in images], "caption": text} for _, images, text in SAMPLES]
    manifest = tmp_path / "lists.jsonl"  # beside tests.unit.test_anyres_data's m.jsonl
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    members = [(f"{key}.{n}.png", paths[k].read_bytes()) for key, images, _ in SAMPLES for n, k in enumerate(images)]
    members += [(f"{key}.txt", text.encode()) for key, _, text in SAMPLES]
    return str(manifest), str(write_tar(tmp_path / "shard.tar", members))


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
    records, problem = read_shard(Path(shard))
    assert problem == "" and [len(r.images) for r in records] == [1, 2, 3] and all(r.image is None for r in records)
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
