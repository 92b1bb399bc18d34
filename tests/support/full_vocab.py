"""An LM whose tokenizer writes every id of its vocabulary, the case `model.llm.extra_tokens` is for: a tiny
random Llama saved with `transformers` beside a word-level tokenizer built offline with `tokenizers` (its words
those of the shapes task's questions and answers, filled up to the vocabulary with more words, so every id is text
or BOS/EOS/UNK), and a JSONL manifest of shapes chats."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image

from mimo.data.shapes import make_samples
from tests.support.hf_helpers import perturb, save, tiny_causal_lm, transformers

VOCAB = 63
"""The checkpoint's vocabulary; with one extra token, 64 rows: divisible by tp 2 and 4."""
SPECIALS = ["<unk>", "<s>", "</s>"]
SAMPLES = 24


def chats(n: int = SAMPLES) -> list[tuple[Image.Image, str, str]]:
    """(image, question, answer) of `n` shapes samples."""
    return [(Image.fromarray(s.images[0]), s.question, s.answer) for s in make_samples(n, 5)]


def full_vocab_words(texts: list[str]) -> list[str]:
    """SPECIALS, every word the Whitespace pre-tokenizer finds in `texts`, then fillers up to VOCAB words."""
    import tokenizers

    split = tokenizers.pre_tokenizers.Whitespace()
    words = list(dict.fromkeys(w for t in texts for w, _ in split.pre_tokenize_str(t)))
    words = SPECIALS + words
    assert len(words) <= VOCAB, f"{len(words)} words do not fit a vocabulary of {VOCAB}"
    return words + [f"filler{i}" for i in range(VOCAB - len(words))]


def save_full_vocab_tokenizer(directory: Path, words: list[str]) -> None:
    """A word-level tokenizer over `words` (ids in order) that prepends <s>: every id is a word, BOS, EOS or UNK."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # words joined by spaces
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    fast.save_pretrained(directory)


def full_vocab_run(root: Path, tie: bool = False) -> tuple[Path, Path]:
    """(the LM directory, with its tokenizer; the manifest): a two-layer Llama of VOCAB ids (untied head unless
    `tie`) and SAMPLES chats with their images under `root`."""
    samples = chats()
    lm_dir, images = root / "lm", root / "images"
    images.mkdir(parents=True)
    torch.manual_seed(0)
    lm = perturb(tiny_causal_lm("llama", vocab_size=VOCAB, tie_word_embeddings=tie, bos_token_id=1,
                                eos_token_id=2, pad_token_id=None))
    save(lm, lm_dir)
    save_full_vocab_tokenizer(lm_dir, full_vocab_words([t for _, q, a in samples for t in (q, a)]))
    lines = []
    for i, (image, question, answer) in enumerate(samples):
        image.save(images / f"{i}.png")
        lines.append({"image": str(images / f"{i}.png"), "conversations": [
            {"from": "human", "value": f"<image>\n{question}"}, {"from": "gpt", "value": answer}]})
    manifest = root / "chats.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return lm_dir, manifest


def full_vocab_overrides(lm_dir: Path, manifest: Path) -> list[str]:
    """tests.support.tiny_run overrides: the VLM over `lm_dir` with `<image>` added by model.llm.extra_tokens as
    the placeholder (id VOCAB), trained on `manifest` with the LM's own tokenizer."""
    return ["--model.llm.heads=4", "--model.llm.kv_heads=2", "--model.llm.mlp=48", "--model.llm.layers=2",
            f"--model.llm.hf_path={lm_dir}", '--model.llm.extra_tokens=["<image>"]',
            f"--model.modalities.images.token_id={VOCAB}", "--data.name=jsonl", f"--data.path={manifest}",
            f"--data.tokenizer={lm_dir}", "--data.seq_len=32", "--data.global_batch=4", "--model.freeze_llm=false"]
