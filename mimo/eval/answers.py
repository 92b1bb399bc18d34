"""Held-out evaluation of the demo task: greedy answers, exact match, per question kind."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from mimo.data.batching import to_device
from mimo.data.demo import DemoVLMData
from mimo.models.generate import greedy_generate
from mimo.models.multimodal import MimoModel


@torch.no_grad()
def greedy_hits(model: MimoModel, data: Any, device: str | torch.device,
                batch_size: int = 100) -> Iterator[tuple[Any, bool]]:
    """Each held-out sample of `data` and whether its greedy answer is exactly right. Greedy decoding
    takes equal-length prompts, so samples go in batches of one prompt length (prompts differ where
    samples hold different inputs, e.g. clips of different durations)."""
    was_training = model.training
    model.eval()
    by_length: dict[int, list] = defaultdict(list)
    prompts = [data.prompt_ids(s) for s in data.eval]
    for s, ids in zip(data.eval, prompts):
        by_length[len(ids)].append((s, ids))
    for pairs in by_length.values():
        for i in range(0, len(pairs), batch_size):
            chunk = [s for s, _ in pairs[i : i + batch_size]]
            prompt = torch.tensor([ids for _, ids in pairs[i : i + batch_size]], device=device)
            inputs = to_device(data.collate(chunk)["modality_inputs"], torch.device(device))
            outs = greedy_generate(model, prompt, inputs, max_new_tokens=12, eos_id=data.tok.EOS)
            for s, ids in zip(chunk, outs):
                yield s, data.tok.decode(ids) == s.answer
    model.train(was_training)


def evaluate_answers(model: MimoModel, data: DemoVLMData, batch_size: int = 100,
                     device: str | torch.device = "cpu") -> dict:
    """Exact-match accuracy of greedy answers on the held-out set, plus the majority baseline."""
    correct: Counter = Counter()
    total: Counter = Counter()
    for s, hit in greedy_hits(model, data, device, batch_size):
        total[s.question] += 1
        correct[s.question] += hit
    answers = Counter(s.answer for s in data.eval)
    n = sum(total.values())
    return {
        "accuracy": sum(correct.values()) / n,
        "per_question": {q: correct[q] / total[q] for q in total},
        "majority_baseline": answers.most_common(1)[0][1] / n,
        "eval_samples": n,
    }
