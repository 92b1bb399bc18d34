"""The one prompt format of real data: how a chat's turns become token ids in training (`conversation_ids`),
and how `mimo generate` asks a question (`question_ids`), so that a question's ids are exactly training's
ids of the same turn up to its answer. The export ships the same format as its chat template.

data.prompt_format = "chat" (LLaVA's own training): the tokenizer's chat template, or LLaVA-1.5's
"USER: ... ASSISTANT:" (`LLAVA_TEMPLATE`) when it has none. The first user turn starts with an "<image>"
line where all the sample's placeholders go (LLaVA moves its image there too); the conversation is rendered
turn by turn and each piece tokenised on its own (the first with the tokenizer's own special tokens when
the format is LLaVA's, a chat template writing its own); only the assistant's answers, through the end of
their turn (EOS), carry labels.
data.prompt_format = "plain" (the format before chats had one; saved runs without the key): BOS, all
placeholders, each user turn's text + "\n", each answer + EOS. The demo sets keep their own layout (BOS,
placeholders, question), `DEMO`. A caption (or an empty question) is BOS, placeholders, caption in every
format.
"""

from __future__ import annotations

from typing import Any

from mimo.data.tokenizer import IMAGE

CHAT, PLAIN, DEMO = "chat", "plain", "demo"
USER_ROLES = ("user", "human", "system")
ASSISTANT_ROLES = ("assistant", "gpt")
MEDIA_MARKS = (IMAGE, "<audio>")

# LLaVA-1.5's conversation (LLaVA's conv_vicuna_v1 without its system line): "USER: q ASSISTANT: a</s>USER: ...".
# A message's content is a string, or a list of {"type": "image"} / {"type": "text", "text": ...} items.
LLAVA_TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- else -%}"
    "{%- for x in c if x['type'] == 'image' -%}<image>\n{%- endfor -%}"
    "{%- for x in c if x['type'] == 'text' -%}{{ x['text'] }}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{{ text(m['content']) + ' ' }}"
    "{%- elif m['role'] == 'user' -%}{{ 'USER: ' + text(m['content']) + ' ' }}"
    "{%- else -%}{{ 'ASSISTANT: ' + text(m['content']) + eos_token }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}ASSISTANT:{%- endif -%}")


class PromptFormatError(ValueError):
    """A chat the format cannot lay out (an unknown role, a chat template that does not extend a conversation
    turn by turn)."""


def special_ids(tok: Any) -> tuple[int | None, int, int]:
    """(bos, eos, pad) of a tokenizer: the byte tokenizer's constants or Hugging Face's *_token_id."""
    if hasattr(tok, "EOS"):
        return tok.BOS, tok.EOS, tok.PAD
    eos = getattr(tok, "eos_token_id", None)
    if eos is None:
        raise ValueError("the tokenizer has no end-of-sequence id (eos_token_id); use a tokenizer that defines one")
    pad = getattr(tok, "pad_token_id", None)
    return getattr(tok, "bos_token_id", None), eos, eos if pad is None else pad


def encode(tok: Any, text: str, specials: bool = False) -> list[int]:
    """`text`'s ids; with `specials` the tokenizer's own special tokens too (the byte tokenizer's: BOS)."""
    if hasattr(tok, "EOS"):
        return ([tok.BOS] if specials else []) + list(tok.encode(text))
    try:
        return list(tok.encode(text, add_special_tokens=specials))
    except TypeError:
        return list(tok.encode(text))


def clean(text: str) -> str:
    """A turn's text without media markers (their placeholders go where the format puts them)."""
    for mark in MEDIA_MARKS:
        text = text.replace(mark, "")
    return text.strip()


def chat_template(tok: Any) -> str:
    """The chat template format "chat" renders with: the tokenizer's own, else `LLAVA_TEMPLATE`."""
    return getattr(tok, "chat_template", None) or LLAVA_TEMPLATE


def render(tok: Any, messages: list[dict], generation: bool) -> str:
    """The conversation as text: through the tokenizer's chat template, or `LLAVA_TEMPLATE` with an empty EOS
    (its id is appended to each answer's ids instead, so the byte tokenizer needs no name for it)."""
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(LLAVA_TEMPLATE).render(messages=messages, add_generation_prompt=generation,
                                                  eos_token="", bos_token="")


def marked_ids(tok: Any, text: str, blocks: list[list[int]], first: bool) -> list[int]:
    """`text`'s ids with each `<image>` replaced by the next of `blocks` (consumed); the very first piece of a
    conversation (`first`) gets the tokenizer's special tokens unless a chat template writes its own."""
    pieces = text.split(IMAGE)
    if len(pieces) - 1 > len(blocks):
        raise PromptFormatError(f"the rendered chat holds more '{IMAGE}' markers than the sample has inputs")
    specials = first and not getattr(tok, "chat_template", None)
    ids = encode(tok, pieces[0], specials)
    for piece in pieces[1:]:
        ids += blocks.pop(0) + encode(tok, piece)
    return ids


def answer_ids(tok: Any, text: str) -> tuple[list[int], list[bool]]:
    """(ids, target) of one assistant turn's text as the format renders it: labels on the answer through its EOS
    (a chat template's own end of turn; what it writes after EOS, e.g. a newline, carries none); EOS appended
    when the text holds none (LLaVA's format)."""
    ids = encode(tok, text)
    eos = special_ids(tok)[1]
    if eos not in ids:
        return ids + [eos], [True] * (len(ids) + 1)
    end = ids.index(eos) + 1
    return ids, [True] * end + [False] * (len(ids) - end)


def messages_of(turns: list[tuple[str, str]], placeholders: bool) -> list[dict]:
    """Chat messages of (role, text) turns: roles as chat templates name them, markers removed, and an `<image>`
    line opening the first user turn when the sample has inputs."""
    out, marked = [], not placeholders
    for role, text in turns:
        if role not in USER_ROLES + ASSISTANT_ROLES:
            raise PromptFormatError(f"unknown chat role '{role}'; use user/human/system or assistant/gpt")
        name = "assistant" if role in ASSISTANT_ROLES else "system" if role == "system" else "user"
        content = clean(text)
        if name == "user" and not marked:
            content, marked = f"{IMAGE}\n{content}", True
        out.append({"role": name, "content": content})
    return out


def chat_ids(tok: Any, messages: list[dict], blocks: list[list[int]],
             open_turn: bool) -> tuple[list[int], list[bool]]:
    """(ids, target) of `messages` rendered turn by turn (see the module doc); with `open_turn` the generation
    prompt of an answer to come ends it."""
    ids: list[int] = []
    target: list[bool] = []
    done = ""
    for k, m in enumerate(messages + [{"role": "assistant"}] * open_turn):
        if m["role"] != "assistant":
            continue
        prompt = render(tok, messages[:k], generation=True)
        if not prompt.startswith(done):
            raise PromptFormatError("the tokenizer's chat template does not extend a conversation turn by turn; "
                                    "set data.prompt_format = 'plain' or use a tokenizer whose template does")
        piece = marked_ids(tok, prompt[len(done):], blocks, first=not done)
        ids, target = ids + piece, target + [False] * len(piece)
        if k == len(messages):
            break
        full = render(tok, messages[: k + 1], generation=False)
        if not full.startswith(prompt):
            raise PromptFormatError("the tokenizer's chat template writes an answer that does not continue its "
                                    "generation prompt; set data.prompt_format = 'plain'")
        answer, is_target = answer_ids(tok, full[len(prompt):])
        ids, target, done = ids + answer, target + is_target, full
    return ids, target


def conversation_ids(tok: Any, fmt: str, turns: list[tuple[str, str]],
                     placeholders: list[int]) -> tuple[list[int], list[bool]]:
    """(ids, target) of a chat for training: every id, and whether the model must produce it."""
    if fmt == CHAT:
        return chat_ids(tok, messages_of(turns, bool(placeholders)), [list(placeholders)], open_turn=False)
    bos, eos, _ = special_ids(tok)
    ids = ([bos] if bos is not None else []) + list(placeholders)
    target = [False] * len(ids)
    for role, text in turns:
        if role in ASSISTANT_ROLES:
            piece, is_target = encode(tok, clean(text)) + [eos], True
        elif role in USER_ROLES:
            piece, is_target = encode(tok, clean(text) + "\n"), False
        else:
            raise PromptFormatError(f"unknown chat role '{role}'; use user/human/system or assistant/gpt")
        ids += piece
        target += [is_target] * len(piece)
    return ids, target


PROBE = [("user", "<image>\nq1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]
"""A two-turn chat the gate lays out before training, so that a template the format cannot follow is refused."""


def check_format(tok: Any, fmt: str) -> None:
    """Raises PromptFormatError where `tok`'s chat template cannot lay out `PROBE` turn by turn."""
    try:
        conversation_ids(tok, fmt, PROBE, [0])
    except PromptFormatError:
        raise
    except Exception as e:  # a template's own refusal (jinja2's TemplateError, its raise_exception)
        raise PromptFormatError(f"the tokenizer's chat template fails on a two-turn chat ({type(e).__name__}: "
                                f"{e}); set data.prompt_format = 'plain' or use a tokenizer whose template "
                                "renders user and assistant turns") from e


def question_ids(tok: Any, fmt: str, text: str, images: list[list[int]], lead: list[int]) -> list[int]:
    """A question's ids as `mimo generate` asks it: training's ids of a one-turn chat up to its answer. `images`
    are each image's placeholders, `lead` the other inputs' (a clip's); the images go first, or at the text's
    `<image>` markers when it has one per image. An empty question asks for a caption (BOS, placeholders)."""
    text = text.strip()
    at_marks = bool(images) and IMAGE in text
    flat = [] if at_marks else [i for x in images for i in x]
    if not text or fmt != CHAT:
        bos = special_ids(tok)[0]
        start = ([bos] if bos is not None else []) + flat + lead
        body = text + "\n" if fmt == PLAIN and text else text
        if not at_marks:
            return start + encode(tok, body)
        first, *rest = body.split(IMAGE)
        return start + encode(tok, first) + [i for x, piece in zip(images, rest) for i in x + encode(tok, piece)]
    if at_marks:
        content, blocks = (f"{IMAGE}\n" if lead else "") + text, ([lead] if lead else []) + [list(x) for x in images]
    else:
        placeholders = flat + lead
        content = f"{IMAGE}\n{clean(text)}" if placeholders else clean(text)  # a stray marker: no input there
        blocks = [placeholders] if placeholders else []
    return chat_ids(tok, [{"role": "user", "content": content}], blocks, open_turn=True)[0]
