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
