"""Generation from a MimoModel.

Text out: greedy decoding with a KV cache; the prompt (with its images) is encoded once, then one token
at a time reuses the cached keys and values of every layer. Prompts of different lengths are left-padded
with an attention mask, as transformers' `generate` takes them. M-RoPE prompts (Qwen2-VL) come with their
`[B, S, 3]` positions (mimo.models.mrope); new tokens continue past each row's largest one.

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


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token prompts of any lengths -> left-padded ids `[B, S]` and their 0/1 attention mask (1 = token)."""
    if not prompts or not all(prompts):
        raise ValueError("left_pad needs at least one prompt, each of at least one token")
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, longest - len(p):] = 1
    return ids, mask


def padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows as transformers' `generate` makes them: 0 at each row's first token,
    padding at 0."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def next_positions(positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`[B]`: the position of each row's first new token, one past the largest of its prompt's (over every axis
    of M-RoPE's `[B, S, 3]`; padding skipped). For M-RoPE this is transformers' Qwen2-VL `rope_deltas` plus the
    row's prompt length; for positions counting 0, 1, ... it is the row's length."""
    top = positions.amax(-1) if positions.dim() == 3 else positions
    return top.masked_fill(attention_mask == 0, -1).amax(1) + 1


@torch.no_grad()
def greedy_generate(model: MimoModel, input_ids: torch.Tensor, modality_inputs: dict | None,
                    max_new_tokens: int, eos_id: int, use_cache: bool = True,
                    attention_mask: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> list[list[int]]:
    """New tokens for each row of a prompt batch `[B, S]`, each cut after its EOS.

    Prompts of different lengths come left-padded with their `[B, S]` 0/1 `attention_mask` (see `left_pad`):
    padded keys are hidden and positions count from each row's first token, as in transformers' `generate`.
    `position_ids` (default: that count) are the prompt's, `[B, S]` or, for an M-RoPE LM, `[B, S, 3]`
    (`mimo.models.mrope.mrope_positions`); the k-th new token of a row sits at `next_positions` + k on every
    axis, as transformers' Qwen2-VL decodes.
    """
    lm = model.language_model
    b, s = input_ids.shape
    dev = input_ids.device
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(dev).long()
    if mask.shape != input_ids.shape or not bool(mask[:, -1].all()):
        raise ValueError(f"attention_mask must be input_ids' shape {tuple(input_ids.shape)} and left-padded (every "
                         f"row's last entry 1), got shape {tuple(mask.shape)}; pad prompts with left_pad")
    pos = padded_positions(mask) if position_ids is None else position_ids.to(dev)
    if pos.shape[:2] != input_ids.shape or pos.dim() not in (2, 3):
        raise ValueError(f"position_ids must be [B, S] or [B, S, 3] with input_ids' {tuple(input_ids.shape)}, got "
                         f"{tuple(pos.shape)}")
    step = next_positions(pos, mask)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    out = torch.empty(b, 0, dtype=torch.long, device=dev)
    cache = KVCache() if use_cache else None
    ids = input_ids
    embeds = model.combined_embeddings(input_ids, modality_inputs)
    for _ in range(max_new_tokens):
        # Without padding the LM's own causal masks (and SDPA's fast causal kernel) serve.
        hidden = lm(embeds, pos, mask=mask if attention_mask is not None else None, cache=cache)
        nxt = model.runtime.logits_fn(hidden[:, -1:], lm)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        new = step.view(b, 1, *[1] * (pos.dim() - 2)).expand(b, 1, *pos.shape[2:])
        step = step + 1
        if use_cache:
            embeds, pos = lm.embed(nxt[:, None]), new
        else:
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            embeds, pos = model.combined_embeddings(ids, modality_inputs), torch.cat([pos, new], dim=1)
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
