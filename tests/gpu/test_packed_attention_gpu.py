"""Packed documents on CUDA (`DocumentRows`: FlexAttention over a block mask, no `[S, S]` mask) against the CPU
reference path (SDPA with the dense document mask, fp32), forward and backward, within bf16 tolerance, eager and
inside a compiled function as a compiled transformer block calls it."""

import pytest
import torch

from mimo.models.layers import DocumentRows, attention
from tests.support.documents import document_ids

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

LENGTHS = [[700, 300, 24], [1024], [1, 511, 512]]


def _run(fn, q, k, v, grad, rows):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, rows)
    out.backward(grad)
    return out.detach().float().cpu(), [t.grad.float().cpu() for t in (q, k, v)]


def _attend(q, k, v, rows):
    return attention(q, k, v, causal=True, mask=rows)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("kv_heads", [12, 2])
def test_flex_path_equals_the_dense_cpu_reference(kv_heads, compiled):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 12, 1024, 128, generator=g)
    k, v = (torch.randn(3, kv_heads, 1024, 128, generator=g) for _ in range(2))
    grad = torch.randn(3, 12, 1024, 128, generator=g)
    ids = document_ids(LENGTHS)
    ref_out, ref_grads = _run(_attend, q, k, v, grad, DocumentRows.of(ids))
    rows = DocumentRows.of(ids.cuda())
    assert rows.block is not None
    fn = torch.compile(_attend) if compiled else _attend
    out, grads = _run(fn, *(t.cuda().bfloat16() for t in (q, k, v, grad)), rows)
    assert (out - ref_out).abs().max() / ref_out.abs().max() < 1e-2
    for got, want in zip(grads, ref_grads):
        assert (got - want).abs().max() / want.abs().max() < 1e-2
