"""The demo vision-language task as token sequences: `<bos> <image>*N question answer <eos> <pad>...`.

Labels are shifted here (position t holds the id of token t+1) and cover only the answer and its
end token, so the loss trains answering, not the question text. Every sequence is padded to one
fixed length, so shapes never depend on which samples a batch holds or how it is split.
"""

from __future__ import annotations

import numpy as np
import torch

from mimo.data.seeded_batches import SeededBatches
from mimo.data.shapes import COLORS, COUNTS, QUESTIONS, SHAPES, Sample, image_tensor_values, make_samples
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.loss import IGNORE_INDEX


def question_answer_rows(pairs: list[tuple[list[int], str]], seq_len: int,
                         tok: ByteTokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) `[B, seq_len]` for (prompt ids, answer) pairs: prompt, answer and EOS, padded;
    the loss is on the answer and EOS, each label at the position that predicts it."""
    ids = torch.full((len(pairs), seq_len), tok.PAD, dtype=torch.long)
    labels = torch.full((len(pairs), seq_len), IGNORE_INDEX, dtype=torch.long)
    for i, (prompt, text) in enumerate(pairs):
        answer = tok.encode(text) + [tok.EOS]
        seq = prompt + answer
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(prompt) - 1 : len(seq) - 1] = torch.tensor(answer)
    return ids, labels


def demo_row_length(image_tokens: int) -> int:
    """Tokens of every row of the shapes task for an image of `image_tokens` rows: the longest prompt and
    answer, padded to a multiple of 8 (so sequence- and context-parallel splits of up to 8 divide it)."""
    longest_q = max(len(q) for q in QUESTIONS.values())
    longest_a = max(len(a) for a in (*COLORS, *SHAPES, *COUNTS))
    return -(-(1 + image_tokens + longest_q + longest_a + 1) // 8) * 8


class DemoVLMData(SeededBatches):
    """Train and held-out sets of the shapes task, tokenised, with a deterministic global order."""

    def __init__(self, train_samples: int, eval_samples: int, seed: int, image_tokens: int,
                 image_token_id: int, modality: str = "images", encoder: str = "vit"):
        self.tok = ByteTokenizer()
        self.image_tokens = image_tokens
        self.image_token_id = image_token_id
        self.modality, self.encoder = modality, encoder
        self.train = make_samples(train_samples, seed)
        self.eval = make_samples(eval_samples, seed + 1_000_003)
        self.seq_len = demo_row_length(image_tokens)

    def prompt_ids(self, s: Sample) -> list[int]:
        return [self.tok.BOS] + [self.image_token_id] * self.image_tokens + self.tok.encode(s.question)

    def collate(self, samples: list[Sample]) -> dict:
        """Samples -> a batch dict of tensors, the keyword arguments of MimoModel.forward."""
        b, s = len(samples), self.seq_len
        ids, labels = question_answer_rows([(self.prompt_ids(x), x.answer) for x in samples], s, self.tok)
        pixels = torch.from_numpy(np.stack([image_tensor_values(x.image) for x in samples]))
        return {
            "input_ids": ids,
            "labels": labels,
            "position_ids": torch.arange(s).expand(b, s).contiguous(),
            "modality_inputs": {self.modality: {self.encoder: {"pixel_values": pixels}}},
        }
