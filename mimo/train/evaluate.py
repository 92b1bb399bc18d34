"""Held-out evaluation of the demo task: greedy answers, exact match, per question kind."""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from mimo.data.demo import DemoVLMData
from mimo.generate import greedy_generate
from mimo.mimo_model import MimoModel


@torch.no_grad()
def evaluate_answers(model: MimoModel, data: DemoVLMData, batch_size: int = 100,
                     device: str | torch.device = "cpu") -> dict:
    """Exact-match accuracy of greedy answers on the held-out set, plus the majority baseline."""
    was_training = model.training
    model.eval()
    by_question: dict[str, list] = defaultdict(list)
    for s in data.eval:
        by_question[s.question].append(s)
    correct: Counter = Counter()
    total: Counter = Counter()
    for question, samples in by_question.items():
        for i in range(0, len(samples), batch_size):
            chunk = samples[i : i + batch_size]
            batch = data.collate(chunk)
            prompt = torch.tensor([data.prompt_ids(s) for s in chunk], device=device)
            mod = batch["modality_inputs"]
            mod = {m: {e: {k: v.to(device) for k, v in kw.items()} for e, kw in enc.items()} for m, enc in mod.items()}
            outs = greedy_generate(model, prompt, mod, max_new_tokens=12, eos_id=data.tok.EOS)
            for s, ids in zip(chunk, outs):
                total[question] += 1
                correct[question] += int(data.tok.decode(ids) == s.answer)
    model.train(was_training)
    answers = Counter(s.answer for s in data.eval)
    n = sum(total.values())
    return {
        "accuracy": sum(correct.values()) / n,
        "per_question": {q: correct[q] / total[q] for q in total},
        "majority_baseline": answers.most_common(1)[0][1] / n,
        "eval_samples": n,
    }
