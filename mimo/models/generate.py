"""Generation from a MimoModel.

Text out: greedy decoding with a KV cache; the prompt (with its images) is encoded once, then one token
at a time reuses the cached keys and values of every layer.

Image out (the Out path): one forward over `<bos> prompt <gen>*P`, then the decoder. All P generation
tokens go in at once: the decoder reads the LM's states at them (the same states training saw), so no
token-by-token loop is needed. Prompts of different lengths are right-padded after their generation
tokens, which the causal LM never lets those tokens see.
"""

from __future__ import annotations

import numpy as np
import torch

from mimo.models.layers import KVCache
from mimo.models.multimodal import MimoModel


@torch.no_grad()
def greedy_generate(model: MimoModel, input_ids: torch.Tensor, modality_inputs: dict | None,
                    max_new_tokens: int, eos_id: int, use_cache: bool = True) -> list[list[int]]:
    """New tokens for each row of an equal-length prompt batch `[B, S]`, each cut after its EOS."""
    lm = model.language_model
    b, s = input_ids.shape
    dev = input_ids.device
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    out = torch.empty(b, 0, dtype=torch.long, device=dev)
    cache = KVCache() if use_cache else None
    ids = input_ids
    embeds = model.combined_embeddings(input_ids, modality_inputs)
    pos = torch.arange(s, device=dev).expand(b, s)
    for t in range(max_new_tokens):
        hidden = lm(embeds, pos, cache=cache)
        nxt = model.logits_fn(hidden[:, -1:], lm)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
        if use_cache:
            embeds = lm.embed(nxt[:, None])
            pos = torch.full((b, 1), s + t, device=dev, dtype=torch.long)
        else:
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            embeds = model.combined_embeddings(ids, modality_inputs)
            pos = torch.arange(ids.shape[1], device=dev).expand(b, -1)
    result = []
    for row in out.tolist():
        result.append(row[: row.index(eos_id) + 1] if eos_id in row else row)
    return result


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
