"""LLaVA prompts: one placeholder run per image with the tower's row count, one BOS, text around it."""

import pytest

from mimo.data.chat import CHAT, question_ids
from mimo.data.tokenizer import load_tokenizer
from tests.support.hf_helpers import transformers

tokenizers = pytest.importorskip("tokenizers")
WORDS = ["<unk>", "<s>", "</s>", "<image>", "USER", "ASSISTANT", "user", "assistant", ":", "what", "is", "this", "?"]


def tiny_tokenizer(directory, chat_template: str | None = None, words: list[str] = WORDS):
    """A word-level tokenizer that prepends <s>, saved and reloaded like a real checkpoint's."""
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(directory)
    return load_tokenizer(directory)


def test_llava_15_format_without_chat_template(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    image = WORDS.index("<image>")
    ids = question_ids(tok, CHAT, "what is this?", [[image] * 5], [])
    expected = [1, 4, 8] + [image] * 5 + [WORDS.index(w) for w in ("what", "is", "this", "?", "ASSISTANT", ":")]
    assert ids == expected


def test_chat_template_and_explicit_placeholder_id(tmp_path):
    template = ("<s>{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}assistant :{% endif %}")
    tok = tiny_tokenizer(tmp_path, template)
    ids = question_ids(tok, CHAT, "<image> <image> what is this?", [[99] * 3] * 2, [])
    assert ids.count(99) == 6 and ids.count(1) == 1 and ids[0] == 1
    assert ids[-2:] == [WORDS.index("assistant"), WORDS.index(":")]


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent"):
        load_tokenizer(tmp_path / "absent")
