"""bench_real_shapes on the CPU at its tiny size: both sides (mimo's Trainer with packing, transformers' LLaVA padded
to the longest) train on the same drawn samples and count the same useful tokens; the accounting against a hand
count on a fixed set of samples; the draw against the mix's published composition."""

import json
import math
from collections import Counter

import pytest

from benchmarks.bench_real_shapes import main
from benchmarks.real_shapes import (
    SOURCES,
    Sample,
    draw_batches,
    draw_samples,
    hf_batch,
    hf_padding,
    mimo_batch,
    mimo_padding,
    sample_length,
)
from benchmarks.workload import image_token_id, image_tokens, load_preset

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = load_preset("tiny")
FIXED = [Sample("vqav2", True, 5, 2), Sample("sharegpt", False, 7, 4), Sample("textcaps", True, 3, 2)]
"""Tiny's images give 16 placeholders: 1 + 16 + 5 = 22, 1 + 7 = 8 and 1 + 16 + 3 = 20 useful tokens, 50 in all."""


def test_both_sides_count_the_same_useful_tokens_of_the_drawn_samples(tmp_path, capsys):
    main(["--size", "tiny", "--out", str(tmp_path), "--batches", "2", "--steps", "2", "--warmup", "0",
          "--global-batch", "4", "--seed", "3", "--baseline", ""])
    rows = [json.loads(line) for line in (tmp_path / "real_shapes_tiny.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == ["mimo", "hf eager"]
    drawn = [draw_samples(4, TINY["seq_len"], image_tokens(TINY), 3 * 1000 + k) for k in range(2)]
    by_hand = sum(sample_length(s, image_tokens(TINY)) for batch in drawn for s in batch) / 2
    for r in rows:
        assert "error" not in r, r
        assert r["useful_tokens_per_step"] == by_hand
        assert math.isfinite(r["final_loss"]) and r["useful_tokens_per_s"] > 0 and 0 <= r["padding_share"] < 1
    assert rows[0]["train"]["device"] == "cpu"
    batches = draw_batches("tiny", 2, 4, seed=3)  # the Trainer packed them as pack_batch does; transformers padded
    for r, stats in zip(rows, (mimo_padding(batches, TINY["seq_len"]), hf_padding([hf_batch(b) for b in batches]))):
        assert r["padding_share"] == round(1 - stats.real / stats.packed, 4)
    assert rows[0]["padding_share"] < rows[1]["padding_share"]
    table = (tmp_path / "real_shapes_tiny.md").read_text()
    assert "| mimo |" in table and "mimo / hf eager (the fastest baseline), useful tokens/s: " in table
    assert table in capsys.readouterr().out + "\n"


def test_useful_tokens_and_padding_of_a_fixed_batch_match_a_hand_count():
    batch = mimo_batch(FIXED, TINY, seed=0)
    hf = hf_batch(batch)
    packed = mimo_padding([batch], TINY["seq_len"])
    padded = hf_padding([hf])
    assert packed.real == padded.real == 50
    assert packed.packed == 64  # the three samples fill one row of 64
    assert padded.packed == 3 * 22  # three rows padded to the longest sample
    assert batch["modality_inputs"]["images"]["vit"]["pixel_values"].shape[0] == 2
    assert batch["modality_counts"]["images"].tolist() == [1, 0, 1]
    assert int((batch["input_ids"] == image_token_id(TINY)).sum()) == 2 * 16


def test_both_layouts_put_the_loss_on_the_same_answer_tokens():
    batch = mimo_batch(FIXED, TINY, seed=0)
    hf = hf_batch(batch)
    assert int((batch["labels"] != -100).sum()) == int((hf["labels"] != -100).sum()) == 2 + 4 + 2
    ids = batch["input_ids"]
    for row, s in enumerate(FIXED):  # transformers' label t is token t; mimo's label t - 1 is the same token
        end = sample_length(s, 16)
        assert hf["labels"][row, end - s.answer : end].tolist() == ids[row, end - s.answer : end].tolist()
        assert batch["labels"][row, end - s.answer - 1 : end - 1].tolist() == ids[row, end - s.answer : end].tolist()
        assert int(hf["attention_mask"][row].sum()) == end


def test_the_draw_follows_the_mix_composition_and_fits_the_rows():
    samples = draw_samples(20_000, 2048, 576, seed=0)
    counts = Counter(s.source for s in samples)
    total = sum(src.thousands for src in SOURCES)
    for src in SOURCES:  # each source's share of LLaVA-1.5's Table 7, within sampling noise
        assert abs(counts[src.name] / len(samples) - src.thousands / total) < 0.01, src.name
    assert all(not s.image for s in samples if s.source == "sharegpt")
    assert all(s.image for s in samples if s.source != "sharegpt")
    assert max(sample_length(s, 576) for s in samples) == 2048  # long chats are cut at the row
    assert draw_samples(8, 2048, 576, seed=5) == draw_samples(8, 2048, 576, seed=5)
