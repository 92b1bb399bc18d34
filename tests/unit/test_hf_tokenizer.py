"""LLaVA prompts: one placeholder run per image with the tower's row count, one BOS, text around it."""

import pytest

from mimo.data.tokenizer import llava_prompt_ids, load_tokenizer
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
    ids = llava_prompt_ids(tok, "what is this?", tokens_per_image=5)
    image = WORDS.index("<image>")
    expected = [1, 4, 8] + [image] * 5 + [WORDS.index(w) for w in ("what", "is", "this", "?", "ASSISTANT", ":")]
    assert ids == expected


def test_chat_template_and_explicit_placeholder_id(tmp_path):
    template = ("<s>{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}assistant :{% endif %}")
    tok = tiny_tokenizer(tmp_path, template)
    ids = llava_prompt_ids(tok, "what is this?", tokens_per_image=3, images=2, image_token_id=99)
    assert ids.count(99) == 6 and ids.count(1) == 1 and ids[0] == 1
    assert ids[-2:] == [WORDS.index("assistant"), WORDS.index(":")]


def test_missing_image_token_and_directory(tmp_path):
    tok = tiny_tokenizer(tmp_path / "t", words=[w for w in WORDS if w != "<image>"])
    with pytest.raises(ValueError, match="no '<image>' token; pass image_token_id"):
        llava_prompt_ids(tok, "what?", tokens_per_image=2)
    with pytest.raises(FileNotFoundError, match="absent"):
        load_tokenizer(tmp_path / "absent")
