"""Held-out evaluation of the audio-visual demo: greedy answers, exact match, image and audio questions apart.

Majority baselines (always giving the most common answer) are reported for image and audio questions
apart.
"""

from __future__ import annotations

from collections import Counter

from mimo.data.audio_demo import AVLMData
from mimo.eval.answers import greedy_hits
from mimo.models.multimodal import MimoModel

KINDS = ("image", "audio")


def evaluate_avlm(model: MimoModel, data: AVLMData, batch_size: int = 100) -> dict:
    """Exact-match accuracy on held-out image questions and audio questions, and per question."""
    device = next(model.parameters()).device
    by_kind, by_question = (Counter(), Counter()), (Counter(), Counter())  # (correct, total)
    for s, hit in greedy_hits(model, data, device, batch_size):
        for (correct, total), key in ((by_kind, s.about), (by_question, s.question)):
            total[key] += 1
            correct[key] += hit
    (correct, total), n = by_kind, len(data.eval)
    baseline = {about: Counter(s.answer for s in data.eval if s.about == about).most_common(1)[0][1] / total[about]
                for about in KINDS if total[about]}
    return {
        "accuracy": sum(correct[k] for k in KINDS) / n,
        "image_accuracy": correct["image"] / max(total["image"], 1),
        "audio_accuracy": correct["audio"] / max(total["audio"], 1),
        "per_question": {q: by_question[0][q] / by_question[1][q] for q in by_question[1]},
        "majority_baseline": baseline,
        "eval_samples": n,
    }
