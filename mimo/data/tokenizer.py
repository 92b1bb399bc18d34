"""Tokenizers: the byte-level one (ids 0-255 are bytes, then a few special tokens; needs no files), Hugging
Face tokenizers from a local directory, and LLaVA-style prompts with image placeholders.

LLaVA convention: the user turn starts with one "<image>" line per image; the text is formatted with the
tokenizer's chat template (or LLaVA-1.5's "USER: ... ASSISTANT:" when it has none), split at each
"<image>", the pieces tokenized separately (as the original LLaVA code does) and each "<image>" replaced
by as many placeholder ids as the vision tower yields rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ByteTokenizer:
    BOS = 256
    EOS = 257
    PAD = 258
    IMAGE = 259
    AUDIO = 260
    GENERATE_IMAGE = 261
    vocab_size = 262

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes up to the first EOS; special tokens are dropped."""
        out = bytearray()
        for i in ids:
            if i == self.EOS:
                break
            if i < 256:
                out.append(i)
        return out.decode("utf-8", errors="replace")


def require_transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("exporting to Hugging Face needs `transformers`; install the extra: "
                           "pip install -e '.[hf]'") from e
    return transformers


IMAGE = "<image>"


def load_tokenizer(path: str | Path, **options: Any) -> Any:
    """The `transformers` tokenizer saved in `path` (tokenizer.json etc.); never downloads. `options` (e.g.
    padding_side) are init options: they override the saved ones and are saved again with the tokenizer."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"tokenizer directory '{p}' does not exist; pass a folder holding tokenizer.json "
                                "(data.tokenizer, or the LM's model.llm.hf_path)")
    return require_transformers().AutoTokenizer.from_pretrained(str(p), local_files_only=True, **options)


def format_llava_prompt(tokenizer: Any, question: str, images: int = 1) -> str:
    """The conversation text for one user turn about `images` images, ending where the answer starts."""
    content = f"{IMAGE}\n" * images + question
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
    return f"USER: {content} ASSISTANT:"


def llava_prompt_ids(tokenizer: Any, question: str, tokens_per_image: int, images: int = 1,
                     image_token_id: int | None = None) -> list[int]:
    """Token ids of a LLaVA prompt with `tokens_per_image` placeholder ids at each image.

    `image_token_id` defaults to the tokenizer's own "<image>" token; pass the model's placeholder id
    (model.modalities.<m>.token_id) when the tokenizer has none.
    """
    if image_token_id is None:
        vocab = tokenizer.get_vocab()
        if IMAGE not in vocab:
            raise ValueError(f"the tokenizer has no '{IMAGE}' token; pass image_token_id (the model's "
                             "model.modalities.<m>.token_id)")
        image_token_id = vocab[IMAGE]
    templated = bool(getattr(tokenizer, "chat_template", None))
    ids: list[int] = []
    for i, piece in enumerate(format_llava_prompt(tokenizer, question, images).split(IMAGE)):
        if i:
            ids += [image_token_id] * tokens_per_image
        # Only the first piece gets the tokenizer's BOS; a chat template writes its own special tokens.
        ids += tokenizer.encode(piece, add_special_tokens=i == 0 and not templated)
    return ids


def with_token(tok: Any, token: str, token_id: int, where: str, what: str, field: str) -> Any:
    """`tok` with the special token `token` at `token_id` (`what` the model uses it for, set by config `field`):
    kept if there (made a special token if it is a plain one), appended if the id is the next free one (filler
    tokens before it if ids are free below it); refused if another token holds the id."""
    vocab = tok.get_vocab()
    if token in vocab:
        if vocab[token] != token_id:
            raise ValueError(f"{where} has '{token}' at id {vocab[token]}, but {what} is {token_id}; set "
                             f"{field} = {vocab[token]}")
        if token not in tok.get_added_vocab():
            # A plain vocabulary entry would be split by the pre-tokenizer, so a processor could not find it in
            # text: made a special token at the same id.
            tok.add_tokens([token], special_tokens=True)
        return tok
    if token_id < len(tok):
        raise ValueError(f"{where} holds '{tok.convert_ids_to_tokens(token_id)}' at id {token_id}, {what}; train "
                         f"with a free id for {field} (>= {len(tok)}) so the export can name it '{token}'")
    filler = [f"<|mimo_reserved_{i}|>" for i in range(len(tok), token_id)]
    tok.add_tokens(filler + [token], special_tokens=True)
    assert tok.convert_tokens_to_ids(token) == token_id
    return tok


def with_extra_tokens(tok: Any, ids: dict[str, int], where: str) -> Any:
    """`tok` with model.llm.extra_tokens as special tokens at their ids ({token: id}, `LLMConfig.extra_token_ids`;
    filler tokens before them where the tokenizer is shorter than the checkpoint's vocabulary), so no pre-tokenizer
    splits them. Refused (ValueError naming the fix) where the tokenizer has a token at or past the first new id, or
    already has one of them."""
    vocab = tok.get_vocab()
    for token, token_id in ids.items():
        if token in vocab and vocab[token] != token_id:
            raise ValueError(f"{where} already has '{token}' at id {vocab[token]}; drop it from model.llm.extra_tokens "
                             f"and use id {vocab[token]}")
        if token not in vocab and token_id < len(tok):
            raise ValueError(f"{where} holds '{tok.convert_ids_to_tokens(token_id)}' at id {token_id}, where "
                             f"model.llm.extra_tokens puts '{token}': it has {len(tok)} ids, more than the "
                             f"{min(ids.values())} rows of model.llm.hf_path; use a tokenizer that fits the checkpoint")
        with_token(tok, token, token_id, where, f"the id model.llm.extra_tokens gives '{token}'",
                   "model.llm.extra_tokens")
    return tok
