"""Greedy decoding with a KV cache gives exactly the tokens of decoding without one."""

import torch

from mimo.config.schema import ModalityConfig, ModelConfig, ViTConfig
from mimo.models.build import build_model
from mimo.models.generate import greedy_generate
from tests.support.configs import tiny_llm


def test_kv_cache_matches_full_recompute():
    torch.manual_seed(0)
    cfg = ModelConfig(llm=tiny_llm(vocab=80, init_std=0.2),
                      modalities={"images": ModalityConfig(token_id=70, vit=ViTConfig(image=16, patch=8, hidden=16,
                                                                                      heads=2, mlp=32))})
    model = build_model(cfg).eval()
    ids = torch.tensor([[1] + [70] * 4 + [5, 6, 7], [2] + [70] * 4 + [8, 9, 10]])
    mod = {"images": {"vit": {"pixel_values": torch.randn(2, 3, 16, 16)}}}
    cached = greedy_generate(model, ids, mod, max_new_tokens=12, eos_id=79, use_cache=True)
    plain = greedy_generate(model, ids, mod, max_new_tokens=12, eos_id=79, use_cache=False)
    assert cached == plain
    assert len(cached[0]) > 3
