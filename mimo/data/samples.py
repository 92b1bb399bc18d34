"""Image-text samples of real data sets: what a reader yields, and how one becomes token ids.

Readers (webdataset.py, jsonl.py) turn their files into `Record`s without decoding any image; a
record says where its image bytes are and holds its caption or chat turns. `encode_text` lays a
record out as `<bos> <image>*N caption <eos>`, or a chat in data.prompt_format (mimo.data.chat), with labels
on what the model must produce: the whole caption, or every assistant turn of a chat. Anything wrong with
a sample raises `BadSample`, which the data set counts and skips instead of crashing.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mimo.data.chat import ASSISTANT_ROLES, PLAIN, PromptFormatError, conversation_ids, encode, special_ids
from mimo.models.loss import IGNORE_INDEX

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
AUDIO_EXTS = (".wav", ".flac", ".ogg", ".mp3", ".opus")


class BadSample(ValueError):
    """A sample that cannot be used (unreadable image, malformed text); it is skipped and counted."""


class BatchFailed(RuntimeError):
    """A sample of a batch failed unexpectedly on some rank: every rank that reads data raises it at the
    same step (the verdict is agreed), so that none of them waits for the others in a collective."""


@dataclass(frozen=True)
class ImageRef:
    """Where an image's encoded bytes live: a whole file, or `size` bytes at `offset` of a tar shard."""

    path: str
    offset: int = -1
    size: int = -1

    def read(self, limit: int = -1) -> bytes:
        """The encoded bytes; with `limit` >= 0 at most that many of them, from the start. Raises BadSample."""
        try:
            with open(self.path, "rb") as f:
                if self.offset < 0:
                    return f.read(limit)
                f.seek(self.offset)
                want = self.size if limit < 0 else min(limit, self.size)
                data = f.read(want)
        except OSError as e:
            raise BadSample(f"image '{self.path}' is unreadable ({e.strerror or e})") from e
        if len(data) != want:
            raise BadSample(f"image at byte {self.offset} of '{self.path}' is cut short")
        return data


@dataclass(frozen=True)
class Record:
    """One sample before decoding. `problem` is set when the reader already knows it is unusable."""

    key: str
    image: ImageRef | None = None
    caption: str | None = None
    turns: tuple[tuple[str, str], ...] = ()
    problem: str = ""
    audio: ImageRef | None = None  # where the clip's encoded bytes live (wav, flac, ...), for audio models
    # A video for native-resolution models: its frames' images in order, sampled at `fps` frames per second.
    frames: tuple[ImageRef, ...] = ()
    fps: float = 2.0
    # Several images (or none) for native-resolution models (JSONL "image": [...]), in order; `image` is then None.
    images: tuple[ImageRef, ...] = ()

    @property
    def text_only(self) -> bool:
        """Whether the sample names no input at all (no image, images, video or clip): its text trains alone."""
        return self.image is None and not self.images and not self.frames and self.audio is None


def text_only_checked(rec: Record, where: str) -> Record:
    """`rec`, unless it names no input while its text writes an `<image>` or `<audio>` placeholder: then a record
    with that problem (a skipped sample, counted), not a text-only sample."""
    texts = [rec.caption or ""] + [content for _, content in rec.turns]
    mark = next((m for m in ("<image>", "<audio>") if any(m in t for t in texts)), None)
    if rec.problem or not rec.text_only or mark is None:
        return rec
    return Record(rec.key, problem=f"{where} writes {mark} in its text but names no {mark[1:-1]} file")


def record_from_json(key: str, meta: Any, image: ImageRef | None, audio: ImageRef | None = None) -> Record:
    """A record from a JSON object with "caption"/"text" (a transcript), or LLaVA "conversations" / chat
    "messages"; `image` and `audio` say where its inputs are."""
    return replace(_text_record(key, meta, image), audio=audio)


def _text_record(key: str, meta: Any, image: ImageRef | None) -> Record:
    if not isinstance(meta, dict):
        return Record(key, image, problem="its JSON is not an object")
    caption = meta.get("caption", meta.get("text"))
    chat = meta.get("conversations", meta.get("messages"))
    if isinstance(chat, list):
        turns = []
        for t in chat:
            role = t.get("from", t.get("role")) if isinstance(t, dict) else None
            content = t.get("value", t.get("content")) if isinstance(t, dict) else None
            if not isinstance(role, str) or not isinstance(content, str):
                return Record(key, image, problem="a chat turn lacks a role or text")
            turns.append((role.lower(), content))
        return Record(key, image, turns=tuple(turns))
    if isinstance(caption, str):
        return Record(key, image, caption=caption)
    return Record(key, image, problem='no "caption", "text", "conversations" or "messages"')


def encode_text(rec: Record, tok: Any, image_tokens: int, image_token_id: int, seq_len: int,
                more_placeholders: list[int] = (), prompt_format: str = PLAIN) -> tuple[list, list]:
    """(ids, labels) of one record, at most `seq_len` long: a chat laid out in `prompt_format` with the image's
    `image_tokens` placeholders, then `more_placeholders` (a clip's), where the format puts them
    (mimo.data.chat); a caption as BOS, placeholders, caption, EOS. Labels are shifted (position t holds the id
    of token t+1) and cover only what the model must produce. Raises BadSample."""
    if rec.problem:
        raise BadSample(rec.problem)
    placeholders = [image_token_id] * image_tokens + list(more_placeholders)
    if rec.turns:
        if not any(role in ASSISTANT_ROLES for role, _ in rec.turns):
            raise BadSample("the chat has no assistant turn to learn from")
        try:
            ids, target = conversation_ids(tok, prompt_format, list(rec.turns), placeholders)
        except PromptFormatError as e:
            raise BadSample(str(e)) from e
    else:
        bos, eos, _ = special_ids(tok)
        ids = ([bos] if bos is not None else []) + placeholders
        piece = encode(tok, rec.caption or "") + [eos]
        if len(piece) == 1:
            raise BadSample("the caption is empty")
        target = [False] * len(ids) + [True] * len(piece)
        ids += piece
    ids, target = ids[:seq_len], target[:seq_len]
    labels = [ids[i + 1] if target[i + 1] else IGNORE_INDEX for i in range(len(ids) - 1)] + [IGNORE_INDEX]
    if all(x == IGNORE_INDEX for x in labels):
        raise BadSample(f"no answer token fits in data.seq_len = {seq_len}")
    return ids, labels


def decode_image(data: bytes, size: int) -> np.ndarray:
    """Encoded image bytes -> float32 CHW in [-1, 1] at `size` x `size`. Raises BadSample."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            rgb = img.convert("RGB").resize((size, size), Image.BICUBIC)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise BadSample(f"the image does not decode ({type(e).__name__}: {e})") from e
    return (np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / 127.5) - 1.0


def resolve_image_path(base: Path, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else base / p
