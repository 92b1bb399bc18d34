"""The data-set registry's contract (mimo.tasks.DATA_SETS): every data set has every entry, and the gate's
facts about it agree with the data set the trainer builds: the row length the gate plans with is the length
of the rows the built set hands out, the tokenizer the gate checks is the one its rows are written with. An
unknown data.name is refused by the gate, naming the field and every known name."""

from __future__ import annotations

import dataclasses
import json

import pytest
from PIL import Image

from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.data.make_shards import make_shards
from mimo.data.shapes import make_samples
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.build import build_model
from mimo.planner.candidates import make_plan
from mimo.tasks import DATA_SETS, DataSet, build_demo_data, data_set
from mimo.train.gate import data_tokenizer, row_length, validate_run
from tests.support.configs import AVLM, T2I, TINY_AVLM, TINY_T2I
from tests.support.tiny_run import DEMO, TINY

pytestmark = pytest.mark.usefixtures("one_thread")

KNOWN = "shapes, avlm, text_to_image, synthetic, webdataset, jsonl"


def manifest(tmp_path) -> str:
    """A JSONL manifest of four shapes images, each captioned with its answer."""
    lines = []
    for i, s in enumerate(make_samples(4, 0)):
        Image.fromarray(s.images[0]).save(tmp_path / f"{i}.png")
        lines.append({"image": str(tmp_path / f"{i}.png"), "caption": s.answer})
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(tmp_path / "m.jsonl")


def shards(tmp_path) -> str:
    """A folder of WebDataset shards of the same four images and captions."""
    src = tmp_path / "src"
    src.mkdir()
    for i, s in enumerate(make_samples(4, 0)):
        Image.fromarray(s.images[0]).save(src / f"{i}.png")
        (src / f"{i}.txt").write_text(s.answer)
    make_shards(src, tmp_path / "shards")
    return str(tmp_path / "shards")


def config_of(name: str, tmp_path):
    """A tiny config that trains on the data set `name`."""
    if name == "avlm":
        return load_config(AVLM, TINY_AVLM)
    if name == "text_to_image":
        return load_config(T2I, TINY_T2I)
    more = {"synthetic": ["--data.seq_len=40"],
            "jsonl": [f"--data.path={manifest(tmp_path)}", "--data.seq_len=48", "--data.tokenizer=byte"],
            "webdataset": [f"--data.path={shards(tmp_path)}", "--data.seq_len=48", "--data.tokenizer=byte"]}
    return load_config(DEMO, [*TINY, f"--data.name={name}", *more.get(name, [])])


def test_every_data_set_has_every_entry():
    fields = [f.name for f in dataclasses.fields(DataSet)]
    assert fields == ["build", "evaluate", "row_length", "check", "tokenizer", "inputs_per_sample", "clip_samples"]
    assert ", ".join(DATA_SETS) == KNOWN
    for name, entry in DATA_SETS.items():
        assert all(callable(getattr(entry, f)) for f in fields), name


@pytest.mark.parametrize("name", ["shapes", "avlm", "text_to_image", "synthetic", "jsonl", "webdataset"])
def test_the_gates_row_length_and_tokenizer_are_the_built_sets(name, tmp_path):
    cfg = config_of(name, tmp_path)
    validate_run(cfg, 1)
    data = build_demo_data(cfg, build_model(cfg.model))
    batch = data.global_batch(0, 2, 0)
    assert row_length(cfg, cfg.model) == batch["input_ids"].shape[1]
    if name in ("jsonl", "webdataset"):  # each read with its own reader: a manifest, a folder of shards
        assert len(data.records) == 4
    tok = data_tokenizer(cfg)
    if name == "synthetic":
        assert tok is None
    else:
        assert isinstance(tok, ByteTokenizer) and isinstance(data.tok, ByteTokenizer)


def test_the_planners_inputs_per_sample_are_the_built_sets():
    """The AVLM demo's share of samples with an image and with a clip, counted over whole cycles of its layouts;
    the shapes demo's images per sample, counted over its training samples."""
    cfg = load_config(AVLM, [*TINY_AVLM, "--data.train_samples=24"])
    samples = build_demo_data(cfg, build_model(cfg.model)).train
    entry = data_set(cfg)
    assert entry.inputs_per_sample(cfg, "vision") == sum(s.image is not None for s in samples) / len(samples)
    assert entry.inputs_per_sample(cfg, "audio") == sum(s.audio is not None for s in samples) / len(samples)
    cfg = load_config(DEMO, [*TINY, "--data.images_per_sample=3", "--data.min_images_per_sample=1",
                             "--data.train_samples=600"])
    samples = build_demo_data(cfg, build_model(cfg.model)).train
    mean = sum(len(s.images) for s in samples) / len(samples)
    assert data_set(cfg).inputs_per_sample(cfg, "vision") == 2.0 and abs(mean - 2.0) < 0.15


def test_an_unknown_data_set_is_refused_naming_the_field_and_the_known_names(tmp_path):
    cfg = load_config(DEMO, [*TINY, "--data.name=shape"])
    message = f"data.name = 'shape' is not a known data set; use one of {KNOWN}"
    with pytest.raises(ConfigError, match=message):
        validate_run(cfg, 1)
    with pytest.raises(ConfigError, match=message):
        build_demo_data(cfg, build_model(cfg.model))
    with pytest.raises(ConfigError, match=message):  # not "no candidate layout passes the config's checks"
        make_plan(cfg, 8, 80.0)
