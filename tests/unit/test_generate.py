"""Greedy decoding with a KV cache gives exactly the tokens of decoding without one, and a left-padded batch
of prompts of different lengths the tokens of each prompt alone."""

import pytest
import torch

from mimo.config.schema import ModalityConfig, ModelConfig, ViTConfig
from mimo.models.build import build_model
from mimo.models.generate import greedy_generate, left_pad
from tests.support.configs import tiny_llm


def tiny_vlm() -> torch.nn.Module:
    """A seeded tiny VLM in eval mode: vocab 80, placeholder 70, four 8-px patches per 16-px image."""
    torch.manual_seed(0)
    cfg = ModelConfig(llm=tiny_llm(vocab=80, init_std=0.2),
                      modalities={"images": ModalityConfig(token_id=70, vit=ViTConfig(image=16, patch=8, hidden=16,
                                                                                      heads=2, mlp=32))})
    return build_model(cfg).eval()


def test_kv_cache_matches_full_recompute():
    model = tiny_vlm()
    ids = torch.tensor([[1] + [70] * 4 + [5, 6, 7], [2] + [70] * 4 + [8, 9, 10]])
    mod = {"images": {"vit": {"pixel_values": torch.randn(2, 3, 16, 16)}}}
    cached = greedy_generate(model, ids, mod, max_new_tokens=12, eos_id=79, use_cache=True)
    plain = greedy_generate(model, ids, mod, max_new_tokens=12, eos_id=79, use_cache=False)
    assert cached == plain
    assert len(cached[0]) > 3


def test_left_padded_batch_gives_each_prompt_its_own_tokens():
    """A batch of prompts of different lengths, left-padded, decodes each prompt as it decodes alone."""
    model = tiny_vlm()
    prompts = [[1] + [70] * 4 + [5, 6, 7], [2, 3] + [70] * 4 + [8, 9, 10, 11, 12], [4] + [70] * 4]
    pixels = torch.randn(3, 3, 16, 16)
    ids, mask = left_pad(prompts, pad_id=0)
    batch = {"images": {"vit": {"pixel_values": pixels}}}
    for use_cache in (True, False):
        together = greedy_generate(model, ids, batch, 10, eos_id=79, use_cache=use_cache, attention_mask=mask)
        alone = [greedy_generate(model, torch.tensor([p]), {"images": {"vit": {"pixel_values": pixels[i:i + 1]}}},
                                 10, eos_id=79)[0] for i, p in enumerate(prompts)]
        assert together == alone
    with pytest.raises(ValueError, match="left-padded"):
        greedy_generate(model, ids, batch, 2, eos_id=79, attention_mask=mask.flip(1))
