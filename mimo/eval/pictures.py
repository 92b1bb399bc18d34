"""The PNG files of the Out path: `mimo generate --out`'s drawing of one prompt and `mimo eval --grid`'s showcase
of true renderings beside generated ones."""

from __future__ import annotations

import numpy as np
from PIL import Image

from mimo.data.tokenizer import ByteTokenizer
from mimo.eval.text_to_image import draw, save_grid, showcase_drawings
from mimo.models.generate import generate_images, to_uint8
from mimo.models.multimodal import MimoModel


def write_image(model: MimoModel, prompt: str, path: str, scale: int = 4) -> str:
    """`mimo generate --out`: draw the byte-tokenised `prompt` with the model's one Out-path modality, as a PNG
    enlarged `scale` times with nearest-neighbour pixels."""
    if len(model.output_token_ids) != 1:
        raise ValueError(f"this run has {len(model.output_token_ids)} Out-path modalities; --out needs a run "
                         "trained with exactly one (model.modalities.<m>.output_token_id), e.g. "
                         "configs/demo_text_to_image.toml")
    (name, tid), = model.output_token_ids.items()
    tok = ByteTokenizer()
    tokens = list(model.modality_submodules[name].decoders.values())[-1].patches_per_image
    ids = [tok.BOS, *tok.encode(prompt)] + [tid] * tokens
    img = Image.fromarray(to_uint8(generate_images(model, name, [ids], tok.PAD))[0])
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    img.save(path)
    return path


def write_showcase_grid(model: MimoModel, data, path: str) -> list[str]:
    """`mimo eval --grid`: one drawing per (colour, shape), true renderings beside generated ones; returns the
    prompts in grid order."""
    shows = showcase_drawings(data.decoder.image)
    made = draw(model, data, shows)
    truth = np.stack([d.image for d in shows])
    pairs = np.concatenate([np.concatenate([truth[i : i + 4], made[i : i + 4]]) for i in range(0, 16, 4)])
    save_grid(pairs, path, columns=8)
    return [d.prompt for d in shows]
