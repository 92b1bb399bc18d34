"""A small learnable chat task on real-data files: PNGs of one filled square (its colour and size drawn at
random), a JSONL manifest of LLaVA-style `conversations` about them, and a word-level Hugging Face tokenizer
with a chat template, all written offline into a folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from tests.support.hf_helpers import transformers

COLOURS = {"red": (230, 30, 30), "green": (30, 210, 40), "blue": (40, 60, 240)}
SIZES = {"small": (9, 14), "big": (22, 30)}  # side in pixels of a 32-pixel image
QUESTIONS = {"colour": "what colour is the square?", "size": "is the square big or small?"}
WORDS = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "user", "assistant", "system", "says", "what", "colour", "is",
         "the", "square", "?", "big", "or", "small", *COLOURS]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} says {{ m['content'] }} </s> {% endfor %}"
            "{% if add_generation_prompt %}assistant says{% endif %}")
"""A chat template as instruction-tuned LMs have: each turn closed by EOS, the answer after `assistant says`."""


def chat_tokenizer(directory: Path, template: str | None = TEMPLATE) -> Path:
    """A saved word-level tokenizer of WORDS (EOS `</s>`), with `template` as its chat template."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="<pad>")
    if template:
        fast.chat_template = template
    fast.save_pretrained(directory)
    return directory


def draw(path: Path, colour: str, size: str, rng: np.random.Generator) -> dict[str, str]:
    """A 32x32 PNG of one square of `colour` and `size` on a dark grey ground; its answers by question."""
    side = int(rng.integers(*SIZES[size]))
    x, y = rng.integers(0, 33 - side, size=2)
    pixels = np.full((32, 32, 3), 40, dtype=np.uint8)
    pixels[y: y + side, x: x + side] = COLOURS[colour]
    Image.fromarray(pixels).save(path)
    return {"colour": colour, "size": size}


def chat_manifest(folder: Path, samples: int, seed: int) -> tuple[Path, list[dict]]:
    """folder/chats.jsonl: each sample a chat of one or both questions (random order) about its own image;
    returns it and each sample's {"image", "colour", "size"}."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines, truth = [], []
    for i in range(samples):
        answers = draw(folder / f"{i}.png", str(rng.choice(list(COLOURS))), str(rng.choice(list(SIZES))), rng)
        asked = list(rng.permutation(list(QUESTIONS)))[: int(rng.integers(1, 3))]
        turns = []
        for k, q in enumerate(asked):
            turns += [{"from": "human", "value": ("<image>\n" if k == 0 else "") + QUESTIONS[q]},
                      {"from": "gpt", "value": answers[q]}]
        lines.append(json.dumps({"image": f"{i}.png", "conversations": turns}))
        truth.append({"image": str(folder / f"{i}.png"), **answers})
    (folder / "chats.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "chats.jsonl", truth
