"""A byte-level tokenizer: ids 0-255 are bytes, then a few special tokens. Needs no files."""

from __future__ import annotations


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
