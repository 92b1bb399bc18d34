"""The one prompt format (mimo.data.chat): the ids `mimo generate` builds for a question are training's ids of
the same turn up to its answer, for a Hugging Face tokenizer with a chat template, one without (LLaVA-1.5's
template) and the byte tokenizer. Oracle: transformers renders the whole conversation with the exported
tokenizer's chat template and tokenizes it at once."""

import pytest

from mimo.config.schema import ConfigError
from mimo.data.chat import CHAT, PLAIN, conversation_ids, question_ids
from mimo.data.tokenizer import ByteTokenizer, load_tokenizer
from mimo.export.tokens import chat_tokenizer
from mimo.train.gate import validate_run
from tests.support.chat_task import WORDS
from tests.support.chat_task import chat_tokenizer as word_tokenizer
from tests.support.hf_helpers import tiny_tokenizer
from tests.support.tiny_run import tiny_config

pytest.importorskip("tokenizers")

ROWS = 3
TURNS = [("system", "be brief"), ("human", "what colour is the square?\n<image>"), ("gpt", "red"),
         ("human", "is the square big or small?"), ("gpt", "small")]


def tokenizers(tmp_path) -> dict:
    """name -> (mimo's tokenizer, its export with `<image>` and the chat template, the placeholder id)."""
    templated = word_tokenizer(tmp_path / "templated")
    plain = tmp_path / "plain"
    tiny_tokenizer(plain, words=[*WORDS, "USER", "ASSISTANT", ":", "be", "brief"])
    image = WORDS.index("<image>")
    return {"template": (load_tokenizer(templated), chat_tokenizer(str(templated), image), image),
            "no template": (load_tokenizer(plain), chat_tokenizer(str(plain), image), image),
            "byte": (ByteTokenizer(), chat_tokenizer("byte", ByteTokenizer.IMAGE), ByteTokenizer.IMAGE)}


def whole_conversation(hf, image: int) -> list[int]:
    """The conversation rendered by transformers and tokenized in one call, the image's one id widened to ROWS."""
    messages = [{"role": {"human": "user", "gpt": "assistant"}.get(r, r), "content": t} for r, t in TURNS]
    messages[1]["content"] = "<image>\n" + TURNS[1][1].replace("\n<image>", "")
    ids = hf(hf.apply_chat_template(messages, tokenize=False))["input_ids"]  # as a processor tokenizes it
    k = ids.index(image)
    return ids[:k] + [image] * ROWS + ids[k + 1:]


@pytest.mark.parametrize("name", ["template", "no template", "byte"])
def test_generate_asks_as_training_laid_out_the_turn(name, tmp_path):
    tok, hf, image = tokenizers(tmp_path)[name]
    ids, target = conversation_ids(tok, CHAT, TURNS, [image] * ROWS)
    assert ids == whole_conversation(hf, image)
    # the answers and their EOS carry the loss, nothing else
    answers = [i for i, t in zip(ids, target) if t]
    eos = hf.eos_token_id
    assert answers == [*hf(" red", add_special_tokens=False)["input_ids"], eos,
                       *hf(" small", add_special_tokens=False)["input_ids"], eos]
    # `mimo generate`'s question (the system turn is training data's own; a question alone has none)
    single = [t for t in TURNS if t[0] != "system"][:2]
    first, first_target = conversation_ids(tok, CHAT, single, [image] * ROWS)
    asked = question_ids(tok, CHAT, "what colour is the square?", [[image] * ROWS], [])
    assert asked == first[: first_target.index(True)] and not any(first_target[: len(asked)])


def test_the_old_format_asks_as_it_trained():
    """data.prompt_format = "plain": BOS, placeholders, the question and "\\n", then the answer and EOS."""
    tok = ByteTokenizer()
    ids, target = conversation_ids(tok, PLAIN, TURNS[1:3], [tok.IMAGE] * ROWS)
    question = [tok.BOS] + [tok.IMAGE] * ROWS + list(b"what colour is the square?\n")
    assert ids == question + list(b"red") + [tok.EOS]
    assert target == [False] * len(question) + [True] * 4
    assert question_ids(tok, PLAIN, "what colour is the square?", [[tok.IMAGE] * ROWS], []) == question


def test_an_empty_question_asks_for_a_caption_and_a_stray_marker_is_dropped():
    tok = ByteTokenizer()
    for fmt in (CHAT, PLAIN):
        assert question_ids(tok, fmt, "", [[tok.IMAGE] * 2], []) == [tok.BOS, tok.IMAGE, tok.IMAGE]
    # a question naming an image it was not given (mimo generate warns) is asked without the marker, as training
    # strips markers from its turns
    assert question_ids(tok, CHAT, "<image> what?", [], []) == [tok.BOS, *b"USER: what? ASSISTANT:"]


def test_a_template_that_does_not_extend_turn_by_turn_is_refused_before_training(tmp_path):
    """A template that writes the last answer differently (as some reasoning templates do) cannot give the
    question's ids as a prefix of training's: the gate refuses it, naming data.prompt_format."""
    odd = ("{% for m in messages %}{% if loop.last and m['role'] == 'assistant' %}says {% endif %}"
           "{{ m['content'] }} </s> {% endfor %}{% if add_generation_prompt %}assistant says{% endif %}")
    folder = word_tokenizer(tmp_path / "odd", template=odd)
    cfg = tiny_config(tmp_path, "--data.name=jsonl", "--data.path=unused.jsonl", f"--data.tokenizer={folder}",
                      f"--model.llm.vocab={len(WORDS)}", f"--model.modalities.images.token_id={WORDS.index('<image>')}")
    refusal = r"data.prompt_format = 'chat' with data.tokenizer = .*does not continue its generation prompt; set"
    with pytest.raises(ConfigError, match=refusal + r" data.prompt_format = 'plain'"):
        validate_run(cfg, 1)
    cfg.data.prompt_format = PLAIN
    validate_run(cfg, 1)
