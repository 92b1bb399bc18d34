"""Text -> image with the Out path: one forward over `<bos> prompt <gen>*P`, then the decoder.

All P generation tokens go in at once: the decoder reads the LM's states at them (the same states
training saw), so no token-by-token loop is needed. Prompts of different lengths are right-padded
after their generation tokens, which the causal LM never lets those tokens see.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from mimo.data.tokenizer import ByteTokenizer
from mimo.mimo_model import MimoModel


@torch.no_grad()
def generate_images(model: MimoModel, modality: str, prompts: list[list[int]], pad_id: int) -> torch.Tensor:
    """Images `[n, C, H, W]` in [-1, 1] for token prompts that each end with the modality's generation tokens."""
    if modality not in model.output_token_ids:
        raise ValueError(f"modality '{modality}' has no Out path in this model; train one with "
                         f"model.modalities.{modality}.output_token_id set")
    device = next(model.parameters()).device
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    ids = ids.to(device)
    hidden = model(ids).hidden
    decoder = list(model.modality_submodules[modality].decoders.values())[-1]
    pred = model.modality_submodules[modality].decode(model.output_rows(modality, hidden, ids))
    return decoder.to_image(pred)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """`[n, C, H, W]` in [-1, 1] -> uint8 `[n, H, W, C]` (the inverse of `image_tensor_values`)."""
    x = ((images.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


def save_png(image: np.ndarray, path: str, scale: int = 1) -> None:
    """Write one uint8 `[H, W, 3]` image, enlarged `scale` times with nearest-neighbour pixels."""
    img = Image.fromarray(image)
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    img.save(path)


def write_image(model: MimoModel, prompt: str, path: str, scale: int = 4) -> str:
    """`mimo generate --out`: draw the byte-tokenised `prompt` with the model's one Out-path modality."""
    if len(model.output_token_ids) != 1:
        raise ValueError(f"this run has {len(model.output_token_ids)} Out-path modalities; --out needs a run "
                         "trained with exactly one (model.modalities.<m>.output_token_id), e.g. "
                         "configs/demo_text_to_image.toml")
    (name, tid), = model.output_token_ids.items()
    tok = ByteTokenizer()
    tokens = list(model.modality_submodules[name].decoders.values())[-1].patches_per_image
    ids = [tok.BOS, *tok.encode(prompt)] + [tid] * tokens
    save_png(to_uint8(generate_images(model, name, [ids], tok.PAD))[0], path, scale)
    return path
