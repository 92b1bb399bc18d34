"""Text-only samples of real data (LLaVA-1.5's ShareGPT chats: no "image", no `<image>`) on a fixed-size vision model:
a manifest reads them beside image samples (ids, labels and `modality_counts` checked by hand: no placeholders and 0
images for them), a chat that writes `<image>` without an image file is skipped and counted, WebDataset shards read
them the same way, packing packs them; a mixed batch's loss is the sum of each sample's loss alone (the text-only
ones through the model without any image, the image ones with their decoded image), the packed step's loss is the
unpacked one's, and a few steps train."""

from __future__ import annotations

import io
import json
import math
import tarfile

import pytest
import torch

from mimo.data.batching import COUNTS
from mimo.data.checks import check_counts, check_placeholders
from mimo.data.image_text import ImageTextData
from mimo.data.jsonl import read_manifest
from mimo.data.packing import pack_batch
from mimo.data.samples import decode_image
from mimo.data.tokenizer import ByteTokenizer
from mimo.data.webdataset import read_shard
from mimo.models.loss import IGNORE_INDEX
from mimo.models.step_hints import forward_args
from mimo.train.trainer import Trainer
from tests.support.text_only_data import chat, data_overrides, mixed_manifest
from tests.support.tiny_run import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

BOS, EOS, PAD, IMG = 256, 257, 258, 259
TOKENS = 4  # a 32-pixel image in 16-pixel patches
SEQ = 40
TEXT_ONLY = {1, 3, 5, 6}
SKIPPED = 4


def _bytes(text: str) -> list[int]:
    return list(text.encode())


def expected_row(sample: int) -> tuple[list[int], list[int]]:
    """A sample's ids and labels, by hand: BOS, a chat in LLaVA-1.5's "USER: q ASSISTANT: a</s>" (data.prompt_format
    "chat" with the byte tokenizer) with an image's placeholders opening the user turn's `<image>` line, or a caption
    after the placeholders; a text-only sample has no placeholders and no `<image>` line. Labels shifted by one, on
    the caption or the answer (and its EOS) only."""
    before, after, answer = {0: ("", "", "red"), 1: ("USER: hi ASSISTANT:", "", " yo"),
                             2: ("USER: ", "\nwhat ASSISTANT:", " a box"), 3: ("", "", "plain"),
                             5: ("USER: why ASSISTANT:", "", " because"), 6: ("USER: sum 2 2 ASSISTANT:", "", " 4"),
                             7: ("", "", "blue")}[sample]
    placeholders = [] if sample in TEXT_ONLY else [IMG] * TOKENS
    ids = [BOS, *_bytes(before), *placeholders, *_bytes(after), *_bytes(answer), EOS]
    first_target = len(ids) - len(answer) - 1
    labels = [ids[t + 1] if t + 1 >= first_target else IGNORE_INDEX for t in range(len(ids) - 1)] + [IGNORE_INDEX]
    return ids + [PAD] * (SEQ - len(ids)), labels + [IGNORE_INDEX] * (SEQ - len(labels))


def test_a_manifest_reads_text_only_samples_beside_images(tmp_path):
    path, samples = mixed_manifest(tmp_path)
    records, problems = read_manifest(path)
    assert problems == [] and [r.text_only and not r.problem for r in records] == [k in TEXT_ONLY for k in range(8)]
    assert records[SKIPPED].problem.endswith("writes <image> in its text but names no image file")
    data = ImageTextData(records, ByteTokenizer(), 32, TOKENS, IMG, SEQ)
    batch = data.global_batch(0, 8, 3)
    order = [int(i) for i in data.global_batch_indices(0, 8, 3)]
    assert sorted(order) == list(range(8))
    images = []
    for row, sample in enumerate(order):
        if sample == SKIPPED:  # a skipped row keeps one zero image and its placeholders, and carries no label
            assert batch["input_ids"][row, :TOKENS].eq(IMG).all() and batch["labels"][row].eq(IGNORE_INDEX).all()
            images.append(torch.zeros(3, 32, 32))
            continue
        ids, labels = expected_row(sample)
        assert batch["input_ids"][row].tolist() == ids and batch["labels"][row].tolist() == labels, sample
        if sample not in TEXT_ONLY:
            images.append(torch.from_numpy(decode_image(open(samples[sample]["image"], "rb").read(), 32)))
    counts = batch[COUNTS]["images"]
    assert counts.tolist() == [int(s not in TEXT_ONLY) for s in order]
    assert torch.equal(batch["modality_inputs"]["images"]["vit"]["pixel_values"], torch.stack(images))
    check_counts(batch)
    check_placeholders(batch, "images", IMG, TOKENS)
    assert data.report()["text_only_samples"] == 4 and data.skipped == 1 and data.bad_samples == {SKIPPED}

    packed, _ = pack_batch(batch, PAD, 2 * SEQ)
    per_row = packed["input_ids"].eq(IMG).sum(1) // TOKENS
    assert torch.equal(packed[COUNTS]["images"], per_row) and int(per_row.sum()) == 4
    assert packed["modality_inputs"]["images"]["vit"]["pixel_values"].shape[0] == 4


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_a_shard_reads_text_only_samples(tmp_path):
    path, samples = mixed_manifest(tmp_path)
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tar:
        _member(tar, "a.png", open(samples[0]["image"], "rb").read())
        _member(tar, "a.txt", b"red")
        _member(tar, "b.json", json.dumps(chat("hi", "yo")).encode())
        _member(tar, "c.txt", b"plain")
        _member(tar, "d.json", json.dumps(chat("look", "no file", image=True)).encode())
    records, problem = read_shard(shard)
    assert problem == "" and [r.text_only for r in records] == [False, True, True, True]
    assert records[2].caption == "plain" and not records[1].problem and not records[2].problem
    assert "writes <image> in its text but names no image file" in records[3].problem


def _alone(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, pixels: torch.Tensor | None) -> float:
    """The loss sum of one sample in a batch of its own: with its image, or (text-only) with no modality input."""
    inputs = {} if pixels is None else {"images": {"vit": {"pixel_values": pixels[None]}}}
    return float(model(input_ids=ids[None], labels=labels[None], modality_inputs=inputs).loss_sum)


def test_a_mixed_batch_loses_what_its_samples_lose_alone(tmp_path):
    path, samples = mixed_manifest(tmp_path)
    trainer = Trainer(tiny_config(tmp_path, *data_overrides(path), "--data.global_batch=8"))
    batch = trainer.data.global_batch(0, 8, trainer.cfg.data.seed)
    order = [int(i) for i in trainer.data.global_batch_indices(0, 8, trainer.cfg.data.seed)]
    model = trainer.model.eval()
    with torch.no_grad():
        mixed = float(model(**forward_args({k: v for k, v in batch.items() if k != COUNTS})).loss_sum)
        alone = 0.0
        for sample in order:
            if sample == SKIPPED:
                continue
            ids, labels = (torch.tensor(x) for x in expected_row(sample))
            image = samples[sample].get("image")
            pixels = None if image is None else torch.from_numpy(decode_image(open(image, "rb").read(), 32))
            alone += _alone(model, ids, labels, pixels)
    assert mixed == pytest.approx(alone, rel=1e-5)


def test_a_mixed_manifest_trains_and_packs_like_it_pads(tmp_path):
    path, _ = mixed_manifest(tmp_path)
    run = [*data_overrides(path), "--data.global_batch=8", "--optim.lr=3e-3"]
    padded, packed = (Trainer(tiny_config(tmp_path / d, *run, *extra))
                      for d, extra in (("a", []), ("b", ["--data.packing=true", f"--data.pack_length={2 * SEQ}"])))
    assert packed.train_step(0)["loss"] == pytest.approx(padded.train_step(0)["loss"], rel=1e-5)
    losses = [padded.train_step(s)["loss"] for s in range(1, 8)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


def test_a_rank_that_reads_nothing_of_a_text_only_row_lays_it_out_as_its_readers_do(tmp_path):
    """The colocated bridges take every row's placeholders from each rank's own batch (`microbatch_rows`), so a rank
    must lay out the rows it reads nothing of as their readers do: no placeholders and 0 images for a text-only
    sample, one image's for any other. Here a rank reads rows 2-3 of 4 only; rows 0-1 are text-only samples."""
    records, _ = read_manifest(mixed_manifest(tmp_path)[0])
    whole, part = (ImageTextData(records, ByteTokenizer(), 32, TOKENS, IMG, SEQ) for _ in range(2))

    def rows_2_3(probe: dict) -> list[dict]:
        return [{"input_ids": probe["input_ids"][2:4],
                 "modality_inputs": {"images": {"vit": {"pixel_values": probe["input_ids"][2:4, 0]}}}}]

    part.shard_for(rows_2_3, 4)
    assert part.text_rows == {2, 3} and part.image_rows == {2, 3}
    assert [int(i) for i in part.global_batch_indices(0, 4, 2)] == [6, 5, 7, 2]
    a, b = whole.global_batch(0, 4, 2), part.global_batch(0, 4, 2)
    assert torch.equal(a["input_ids"].eq(IMG).sum(1), b["input_ids"].eq(IMG).sum(1))
    assert b[COUNTS]["images"].tolist() == [0, 0, 1, 1] and b["input_ids"][:2].eq(PAD).all()
    assert torch.equal(a["input_ids"][2:], b["input_ids"][2:]) and torch.equal(a["labels"][2:], b["labels"][2:])
