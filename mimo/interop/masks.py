"""Hugging Face-style padding masks for mimo's LM, which takes a boolean `[B, 1, S, S]` attention mask."""

from __future__ import annotations

import torch


def padded_causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Causal mask that also hides padded keys, from a `[B, S]` 0/1 `attention_mask` (1 = real token).

    Every query may still see itself: a left-padding query would otherwise see no key at all, its softmax
    would be NaN, and the NaN would leak into real tokens through the next layer's masked-out values.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, S], got shape {tuple(attention_mask.shape)}")
    s = attention_mask.shape[1]
    keep = attention_mask.bool()[:, None, None, :]
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
    return (causal & keep) | torch.eye(s, dtype=torch.bool, device=attention_mask.device)
