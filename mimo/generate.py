"""Greedy decoding with a KV cache: the prompt (with its images) is encoded once, then one token at
a time reuses the cached keys and values of every layer."""

from __future__ import annotations

import torch

from mimo.mimo_model import MimoModel
from mimo.models.layers import KVCache


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
