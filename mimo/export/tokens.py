"""What an exported directory needs beside its weights for `AutoTokenizer`, `AutoProcessor` and `generate`:
the run's tokenizer (the byte tokenizer as a Hugging Face one, or the run's own, with the `<image>` token at
the model's placeholder id), bos/eos/pad ids, generation_config.json, and a LLaVA processor whose image
processor resizes and normalises pixels as mimo's data does (bicubic to the tower's size, then to [-1, 1]).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mimo.config.schema import ViTConfig
from mimo.data.chat import chat_template, special_ids
from mimo.data.tokenizer import (
    IMAGE,
    ByteTokenizer,
    load_tokenizer,
    require_transformers,
    with_extra_tokens,
    with_token,
)

# Names of the byte tokenizer's special ids (256 and up) in its Hugging Face form.
BYTE_SPECIALS = {ByteTokenizer.BOS: "<|bos|>", ByteTokenizer.EOS: "<|eos|>", ByteTokenizer.PAD: "<|pad|>",
                 ByteTokenizer.IMAGE: "<|image|>", ByteTokenizer.AUDIO: "<|audio|>",
                 ByteTokenizer.GENERATE_IMAGE: "<|generate_image|>"}
# mimo's pixels: x / 127.5 - 1 = (x / 255 - 0.5) / 0.5 (mimo.data.samples.decode_image, shapes.image_tensor_values).
PIXEL_MEAN = PIXEL_STD = [0.5, 0.5, 0.5]
BICUBIC = 3


def byte_tokenizer(named: dict[int, str] | None = None) -> Any:
    """mimo's ByteTokenizer as a `PreTrainedTokenizerFast`: ids 0-255 are bytes, then the special tokens at
    their ids, `named` ({id: name}, e.g. the image placeholder as `<image>`) replacing the byte tokenizer's own
    names from IMAGE (259) up; encoding prepends BOS, as `mimo generate` does. Refuses a name at a byte or at
    BOS/EOS/PAD."""
    tf = require_transformers()
    import tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = bytes_to_unicode()
    model = tokenizers.models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[])
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    names = dict(BYTE_SPECIALS)
    for i, name in (named or {}).items():
        if i < ByteTokenizer.IMAGE:
            held = f"byte {i}" if i < 256 else f"'{BYTE_SPECIALS[i]}'"
            raise ValueError(f"tokenizer 'byte' holds {held} at id {i}, where the model has '{name}'; train with "
                             f"an id of {ByteTokenizer.IMAGE} or more for it (ByteTokenizer.IMAGE = 259)")
        names[i] = name
    for i in range(256, max(names) + 1):
        tok.add_special_tokens([names.get(i, f"<|reserved_{i}|>")])
    bos = BYTE_SPECIALS[ByteTokenizer.BOS]
    tok.post_processor = tokenizers.processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                                  special_tokens=[(bos, ByteTokenizer.BOS)])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=BYTE_SPECIALS[ByteTokenizer.EOS],
                                      pad_token=BYTE_SPECIALS[ByteTokenizer.PAD], padding_side="left")


def with_image_token(tok: Any, image_token_id: int, where: str) -> Any:
    """`tok` with `<image>` at `image_token_id` (`with_token`)."""
    return with_token(tok, IMAGE, image_token_id, where, "the model's image placeholder",
                      "model.modalities.<m>.token_id")


def run_tokenizer(spec: str, image_token_id: int | None, extra_tokens: dict[str, int] | None = None) -> Any:
    """The tokenizer a run trained with (`data.tokenizer`: `byte` or a Hugging Face directory) as a Hugging
    Face tokenizer that pads on the left (with EOS when it has no pad token), with model.llm.extra_tokens at their
    ids ({token: id}) and `<image>` at the placeholder id when there is one."""
    if spec == "byte":
        return byte_tokenizer(None if image_token_id is None else {image_token_id: IMAGE})
    # An init option, not the attribute: save_pretrained writes only init options, and a right-padding export
    # would decode batches of prompts of different lengths wrongly under `generate`.
    tok = load_tokenizer(spec, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok = with_extra_tokens(tok, extra_tokens or {}, f"tokenizer '{spec}'")
    return tok if image_token_id is None else with_image_token(tok, image_token_id, f"tokenizer '{spec}'")


def chat_tokenizer(spec: str, image_token_id: int, extra_tokens: dict[str, int] | None = None) -> Any:
    """`run_tokenizer` carrying the chat template a run of data.prompt_format = "chat" laid out its chats with
    (LLaVA-1.5's where the tokenizer has none: mimo.data.chat), so that `apply_chat_template` asks as training."""
    tok = run_tokenizer(spec, image_token_id, extra_tokens)
    tok.chat_template = chat_template(tok)
    return tok


def token_ids(tok: Any) -> dict[str, int | None]:
    """bos/eos/pad ids as config.json and generation_config.json name them (pad = eos when there is none)."""
    bos, eos, pad = special_ids(tok)
    return {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}


def save_generation_config(ids: dict[str, int | None], directory: Path) -> None:
    """generation_config.json with the run's ids, so `generate` stops at EOS and pads with PAD."""
    require_transformers().GenerationConfig(**ids).save_pretrained(directory)


def image_processor(vit: ViTConfig) -> Any:
    """Resize (bicubic) to the tower's square size, RGB, rescale and normalise to [-1, 1]: mimo's pixels."""
    tf = require_transformers()
    return tf.SiglipImageProcessorPil(size={"height": vit.image, "width": vit.image}, resample=BICUBIC,
                                      image_mean=PIXEL_MEAN, image_std=PIXEL_STD, rescale_factor=1 / 255,
                                      do_convert_rgb=True)


def save_llava_processor(tok: Any, vit: ViTConfig, strategy: str, directory: Path) -> None:
    """processor_config.json and the tokenizer files: `AutoProcessor` expands each `<image>` into as many
    placeholders as the tower gives rows, and prepares the pixels as mimo does."""
    tf = require_transformers()
    proc = tf.LlavaProcessor(image_processor=image_processor(vit), tokenizer=tok, patch_size=vit.patch,
                             vision_feature_select_strategy=strategy, image_token=IMAGE,
                             num_additional_image_tokens=int(vit.class_token),
                             chat_template=getattr(tok, "chat_template", None))
    proc.save_pretrained(directory)


def write_video_processor_config(directory: Path, processor_class: str, images: Any, video_processor_type: str,
                                 not_for_frames: tuple[str, ...] = (), **fields: Any) -> None:
    """processor_config.json as `processor_class` saves it, for a class that cannot be built without torchvision
    (its video processor needs it): `fields`, the image processor `images`, and a video processor of
    `video_processor_type` that prepares frames as `images` does (without the image-only keys `not_for_frames`)."""
    image = images.to_dict()
    frames = {k: x for k, x in image.items() if k not in ("image_processor_type", *not_for_frames)}
    config = dict(fields, processor_class=processor_class, image_processor=image,
                  video_processor=dict(frames, video_processor_type=video_processor_type))
    (directory / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make_readable(directory: Path) -> None:
    """Every file 0644 (safetensors writes 0600), every folder 0755: an export is shared, not private."""
    for root, dirs, files in os.walk(directory):
        for d in dirs:
            os.chmod(Path(root) / d, 0o755)
        for f in files:
            os.chmod(Path(root) / f, 0o644)
    os.chmod(directory, 0o755)
