"""The workload of bench_real_shapes, shared by its two sides: samples of LLaVA-1.5's instruction mix, their global
batches in mimo's layout (padded; the Trainer packs them) and in transformers' (padded to the longest), and the
one count of useful tokens and padding of both.

Source: the LLaVA-1.5 paper (Liu et al., "Improved Baselines with Visual Instruction Tuning", arXiv 2310.03744,
Table 7), its 665k-sample instruction mix `llava_v1_5_mix665k.json`. PUBLISHED, and used as they are: each source's
share of the samples (`SOURCES`' counts, in thousands) and whether its samples hold an image (every source one
image, ShareGPT none). haotian-liu/LLaVA issue #657 counts the released file by its "image" key: 364,100 COCO
(LLaVA 158K + VQAv2 83K + OKVQA 9K + A-OKVQA 66K + RefCOCO 48K), 86,417 VG, 72,140 GQA, 80,000 OCR-VQA, 21,953
TextCaps and 40,688 text-only (ShareGPT) of 665,298: 6.1 % of the samples hold no image, the rest exactly one.
ASSUMED, as neither the paper nor the file's documentation publishes per-source lengths: each source's text length
in tokens of a LLaMA-style tokenizer (chat template and system prompt included), drawn log-uniform in `SOURCES`'
range, cut where the sample would pass the model's 2,048 tokens (LLaVA-1.5's model_max_length). The ranges follow
each source's format: short-answer VQA sources merge all questions of an image into one conversation (VQAv2's
~5 per image, GQA's ~13, OCR-VQA's ~5, each turn ~25 tokens with LLaVA-1.5's "Answer the question using a single
word or phrase." prompt), OKVQA and TextCaps hold one short question or caption, RefCOCO and VG several region turns
with box coordinates, LLaVA-Instruct GPT-4's conversations and descriptions of a few hundred tokens, and ShareGPT
long multi-turn chats that often reach the cut. Also assumed: the answers (the loss) are the last half of the text.

A sample is laid out as mimo's readers lay one out: BOS, the image's placeholders (if any), then its text ending in
EOS (random byte ids: the cost does not depend on them). The useful tokens of a sample are all of these: each one
carries a label or is context that a label's prediction reads (the sample ends with an answer). Sizes: `small` and
`tiny` of benchmarks/baseline/presets.json (tiny scales the text lengths by its seq_len / 2,048, at least 3
tokens, for the CPU tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.workload import image_token_id, image_tokens, load_preset
from mimo.data.batching import COUNTS
from mimo.data.packing import PackStats, pack_batch
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.loss import IGNORE_INDEX

MODALITY, ENCODER, KEY = "images", "vit", "pixel_values"
FULL_LENGTH = 2048
"""LLaVA-1.5's model_max_length: the token lengths of `SOURCES` are at this scale."""
ANSWER_SHARE = 0.5
"""The share of a sample's text that is answer (carries the loss): assumed."""


@dataclass(frozen=True)
class Source:
    """One source of the mix: thousands of samples (published), images per sample (published), and the range of its
    text length in tokens (assumed, see the module docstring)."""

    name: str
    thousands: int
    images: int
    text: tuple[int, int]


SOURCES = (
    Source("llava_instruct", 158, 1, (120, 900)),
    Source("sharegpt", 40, 0, (200, 2048)),
    Source("vqav2", 83, 1, (80, 300)),
    Source("gqa", 72, 1, (150, 600)),
    Source("okvqa", 9, 1, (40, 100)),
    Source("ocrvqa", 80, 1, (100, 300)),
    Source("aokvqa", 66, 1, (50, 150)),
    Source("textcaps", 22, 1, (40, 90)),
    Source("refcoco", 48, 1, (100, 500)),
    Source("vg", 86, 1, (100, 500)),
)


@dataclass(frozen=True)
class Sample:
    """One drawn sample: its source, whether it holds an image, its text tokens (EOS included) and answer tokens."""

    source: str
    image: bool
    text: int
    answer: int


def draw_samples(n: int, seq_len: int, placeholders: int, seed: int) -> list[Sample]:
    """`n` samples of the mix, seeded: a source by its share, a text length log-uniform in the source's range
    (scaled by seq_len / FULL_LENGTH), cut so that BOS + placeholders + text fit `seq_len`."""
    rng = np.random.default_rng(seed)
    weights = np.array([s.thousands for s in SOURCES], dtype=float)
    picks = rng.choice(len(SOURCES), size=n, p=weights / weights.sum())
    scale = seq_len / FULL_LENGTH
    samples = []
    for k in picks:
        src = SOURCES[int(k)]
        lo, hi = (max(3, round(x * scale)) for x in src.text)
        text = int(round(np.exp(rng.uniform(np.log(lo), np.log(hi)))))
        text = min(text, seq_len - 1 - placeholders * src.images)
        samples.append(Sample(src.name, bool(src.images), text, max(1, round(text * ANSWER_SHARE))))
    return samples


def sample_length(s: Sample, placeholders: int) -> int:
    """Tokens of a sample: BOS, its image's placeholders, its text. All of them are useful tokens."""
    return 1 + placeholders * s.image + s.text


def mimo_batch(samples: list[Sample], p: dict, seed: int) -> dict:
    """The global batch of `samples` as a mimo data set gives one (MimoModel.forward's keywords plus
    `modality_counts`): rows padded to the longest, labels shifted (position t holds the id of token t + 1, on the
    answers only), each image's pixels random (seeded) in `modality_inputs`, `[0, 3, H, W]` when none."""
    tok, placeholders = ByteTokenizer(), image_tokens(p)
    gen = torch.Generator().manual_seed(seed)
    lengths = [sample_length(s, placeholders) for s in samples]
    n, width = len(samples), max(lengths)
    ids = torch.full((n, width), tok.PAD, dtype=torch.long)
    labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    for row, (s, length) in enumerate(zip(samples, lengths)):
        text = torch.randint(0, 256, (s.text,), generator=gen)
        text[-1] = tok.EOS
        ids[row, 0] = tok.BOS
        ids[row, 1 : 1 + placeholders * s.image] = image_token_id(p)
        ids[row, length - s.text : length] = text
        first = length - s.answer  # the first answer token: its prediction sits one position before
        labels[row, first - 1 : length - 1] = ids[row, first:length]
    v = p["vision"]
    images = sum(s.image for s in samples)
    pixels = torch.randn(images, 3, v["image"], v["image"], generator=gen)
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(width).expand(n, width).contiguous(),
            "modality_inputs": {MODALITY: {ENCODER: {KEY: pixels}}},
            COUNTS: {MODALITY: torch.tensor([int(s.image) for s in samples], dtype=torch.long)}}


def draw_batches(size: str, count: int, global_batch: int, seed: int) -> list[dict]:
    """`count` global batches of `global_batch` samples each for preset `size` (the draw of batch k seeded by
    (seed, k)): the batches both sides train on, cycled."""
    p = load_preset(size)
    return [mimo_batch(draw_samples(global_batch, p["seq_len"], image_tokens(p), seed * 1000 + k), p, seed * 1000 + k)
            for k in range(count)]


def hf_batch(batch: dict) -> dict:
    """A mimo batch as LlavaForConditionalGeneration's keywords: the same ids, right-padded, with their
    attention_mask; labels unshifted (transformers shifts them); the same pixels (None when the batch has no image)."""
    ids, labels = batch["input_ids"], batch["labels"]
    unshifted = torch.cat([torch.full_like(labels[:, :1], IGNORE_INDEX), labels[:, :-1]], dim=1)
    pixels = batch["modality_inputs"][MODALITY][ENCODER][KEY]
    return {"input_ids": ids, "attention_mask": (ids != ByteTokenizer.PAD).long(), "labels": unshifted,
            "pixel_values": pixels if len(pixels) else None}


def hf_padding(batches: list[dict]) -> PackStats:
    """Useful tokens (attention_mask's ones) and the tokens transformers' rows spend, over `batches` (hf_batch's)."""
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    spent = sum(b["attention_mask"].numel() for b in batches)
    return PackStats(real=real, unpacked=spent, packed=spent)


def mimo_padding(batches: list[dict], pack_length: int, row_multiple: int = 1) -> PackStats:
    """What mimo's packing (mimo.data.packing.pack_batch) makes of `batches`: useful tokens and packed row tokens."""
    total = PackStats()
    for b in batches:
        total.add(pack_batch(b, ByteTokenizer.PAD, pack_length, row_multiple)[1])
    return total


def throughput_row(stats: PackStats, batches: int, timing: dict, device: torch.device, model: torch.nn.Module,
                   **extra: object) -> dict:
    """One side's figures from `stats` of `batches` global batches and bench_vlm.time_steps' `timing`: useful
    tokens per step and per second (over the mean timed step; the timed steps cover every batch equally), the
    padding share of its rows, step times, peak memory and the last loss."""
    cuda = device.type == "cuda"
    useful = stats.real / batches
    return {**extra, "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "useful_tokens_per_step": round(useful, 1),
            "useful_tokens_per_s": round(useful / timing["step_s_mean"], 1),
            "padding_share": round(1 - stats.real / max(stats.packed, 1), 4),
            "row_tokens_per_step": stats.packed // batches,
            "step_s_mean": round(timing["step_s_mean"], 5), "step_s_median": round(timing["step_s_median"], 5),
            "first_step_s": round(timing["first_step_s"], 2),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "params_m": round(sum(x.numel() for x in model.parameters()) / 1e6, 1),
            "final_loss": round(timing["final_loss"], 4)}
