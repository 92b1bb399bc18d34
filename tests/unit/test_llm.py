"""The decoder LM is causal, and grouped-query attention equals full attention with repeated KV heads."""

import pytest
import torch

from mimo.models.layers import attention
from mimo.models.llm import DecoderLM
from tests.support.configs import tiny_llm


def test_decoder_is_causal():
    torch.manual_seed(0)
    lm = DecoderLM(tiny_llm(vocab=50))
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
    lm = DecoderLM(tiny_llm(vocab=50, hidden=16, layers=1, heads=2, kv_heads=1, mlp=32, tie_embeddings=True))
    assert lm.lm_head is None
    h = torch.randn(2, 3, 16)
    assert torch.equal(lm.logits(h), h @ lm.embed_tokens.weight.t())


def test_untied_logits_run_the_head_module_and_its_hooks():
    """The untied head is called as a module (FSDP2 gathers a sharded head through its hooks), and its
    logits equal the product with its weight."""
    lm = DecoderLM(tiny_llm(vocab=50, hidden=16, layers=1, heads=2, kv_heads=1, mlp=32))
    seen = []
    lm.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    h = torch.randn(2, 3, 16)
    assert torch.allclose(lm.logits(h), h @ lm.lm_head.weight.t(), atol=1e-6)
    assert seen == [h.shape]


def test_output_rows_match_the_full_forward_and_its_gradients():
    """Asking for some rows only (the last layer skips the others' output projection, MLP and final norm)
    gives those rows of the full output, and the same gradients for every parameter and the input, in fp64."""
    torch.manual_seed(0)
    lm = DecoderLM(tiny_llm(vocab=50, layers=3)).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(10).expand(2, 10)
    rows = torch.tensor([3, 4, 5, 6, 7, 8, 13, 14, 15, 16, 17, 18])  # the text rows of two samples
    weights = torch.randn(len(rows), 32, dtype=torch.float64)
    named = [(n, p) for n, p in lm.named_parameters() if n.startswith(("layers.", "norm."))]
    full = lm(x, pos).flatten(0, 1).index_select(0, rows)
    full_grads = torch.autograd.grad((full * weights).sum(), [x, *(p for _, p in named)])
    part = lm(x, pos, output_rows=rows)
    part_grads = torch.autograd.grad((part * weights).sum(), [x, *(p for _, p in named)])
    torch.testing.assert_close(part, full, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(["input", *(n for n, _ in named)], part_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_output_rows_need_a_layer_to_drop_rows_in():
    lm = DecoderLM(tiny_llm(vocab=50, layers=1))
    lm.layers = torch.nn.ModuleDict()  # a pipeline stage that holds only the final norm
    with pytest.raises(ValueError, match="output_rows"):
        lm(torch.randn(1, 4, 32), torch.arange(4)[None], output_rows=torch.tensor([1, 2]))
