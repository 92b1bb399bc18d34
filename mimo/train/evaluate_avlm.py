"""Held-out evaluation of the audio-visual demo: greedy answers, exact match, image and audio questions apart.

Prompts differ in length (a clip's token count follows its duration, and samples lack one modality
or the other), and greedy decoding takes equal-length prompt batches, so samples are grouped by
prompt length. Majority baselines (always giving the most common answer) are reported for image and
audio questions apart.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from mimo.data.audio_demo import AVLMData, AVSample
from mimo.generate import greedy_generate
from mimo.mimo_model import MimoModel


def _to(x: dict | torch.Tensor, device: torch.device) -> dict | torch.Tensor:
    return {k: _to(v, device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)


@torch.no_grad()
def evaluate_avlm(model: MimoModel, data: AVLMData, batch_size: int = 100) -> dict:
    """Exact-match accuracy on held-out image questions and audio questions, and per question."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    by_length: dict[int, list[AVSample]] = defaultdict(list)
    for s in data.eval:
        by_length[len(data.prompt_ids(s))].append(s)
    correct: Counter = Counter()
    total: Counter = Counter()
    for samples in by_length.values():
        for i in range(0, len(samples), batch_size):
            chunk = samples[i : i + batch_size]
            prompt = torch.tensor([data.prompt_ids(s) for s in chunk], device=device)
            inputs, _ = data.modality_inputs(chunk)
            outs = greedy_generate(model, prompt, _to(inputs, device), max_new_tokens=12, eos_id=data.tok.EOS)
            for s, ids in zip(chunk, outs):
                hit = int(data.tok.decode(ids) == s.answer)
                for key in (s.about, s.question):
                    total[key] += 1
                    correct[key] += hit
    model.train(was_training)
    n = len(data.eval)
    baseline = {about: Counter(s.answer for s in data.eval if s.about == about).most_common(1)[0][1] / total[about]
                for about in ("image", "audio") if total[about]}
    return {
        "accuracy": (correct["image"] + correct["audio"]) / n,
        "image_accuracy": correct["image"] / max(total["image"], 1),
        "audio_accuracy": correct["audio"] / max(total["audio"], 1),
        "per_question": {q: correct[q] / total[q] for q in total if q not in ("image", "audio")},
        "majority_baseline": baseline,
        "eval_samples": n,
    }
