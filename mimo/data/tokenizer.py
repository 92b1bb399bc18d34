"""Tokenizers: the byte-level one (ids 0-255 are bytes, then a few special tokens; needs no files), Hugging
Face tokenizers from a local directory, and which of them a run used. How a chat becomes ids: mimo.data.chat.
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


def run_tokenizer_spec(data_tokenizer: str, llm_hf_path: str) -> str:
    """The tokenizer a run used: data.tokenizer when it is a directory, else the LM's hf_path when that holds
    a tokenizer, else the byte tokenizer."""
    if Path(data_tokenizer).is_dir():
        return data_tokenizer
    if llm_hf_path and any((Path(llm_hf_path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return llm_hf_path
    return "byte"


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
