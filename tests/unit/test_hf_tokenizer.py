"""LLaVA prompts: one placeholder run per image with the tower's row count, one BOS, text around it."""

import pytest

from mimo.data.chat import CHAT, question_ids
from mimo.data.tokenizer import load_tokenizer
from tests.support.hf_helpers import WORDS, tiny_tokenizer


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
