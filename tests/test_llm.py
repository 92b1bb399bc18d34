"""The decoder LM is causal, and grouped-query attention equals full attention with repeated KV heads."""

import torch

from mimo.config import LLMConfig
from mimo.models.layers import attention
from mimo.models.llm import DecoderLM


def test_decoder_is_causal():
    torch.manual_seed(0)
    lm = DecoderLM(LLMConfig(vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, mlp=64))
    ids = torch.randint(0, 50, (2, 10))
    pos = torch.arange(10).expand(2, 10)
    a = lm.logits(lm(lm.embed(ids), pos))
    ids2 = ids.clone()
    ids2[:, 6:] = (ids2[:, 6:] + 1) % 50
    b = lm.logits(lm(lm.embed(ids2), pos))
    assert torch.equal(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_gqa_equals_repeated_heads():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                           is_causal=True)
    assert torch.allclose(attention(q, k, v, causal=True), ref)


def test_tied_head_uses_embedding():
    lm = DecoderLM(LLMConfig(vocab=50, hidden=16, layers=1, heads=2, kv_heads=1, mlp=32, tie_embeddings=True))
    assert lm.lm_head is None and lm.output_weight() is lm.embed_tokens.weight
