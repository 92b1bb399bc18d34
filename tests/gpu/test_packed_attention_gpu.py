"""Packed documents on CUDA (`DocumentRows`: FlexAttention over a block mask, no `[S, S]` mask) against the CPU
reference path (SDPA with the dense document mask, fp32), forward and backward, within bf16 tolerance, eager and
inside a compiled function as a compiled transformer block calls it: whole rows, and one context-parallel rank's
zigzag queries against the all-gathered keys (cp2, each rank; rows of whole blocks and of partial ones)."""

import pytest
import torch

from mimo.models.layers import DocumentRows, attention
from mimo.parallel.context import gathered_order, zigzag_index
from tests.support.documents import document_ids

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

LENGTHS = [[700, 300, 24], [1024], [1, 511, 512]]
SHORT = [[600, 376, 24], [1000], [1, 499, 500]]  # 1000 positions: cp2 chunks of 250, not whole 128-blocks


def _run(fn, q, k, v, grad, rows):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, rows)
    out.backward(grad)
    return out.detach().float().cpu(), [t.grad.float().cpu() for t in (q, k, v)]


def _attend(q, k, v, rows):
    return attention(q, k, v, causal=True, mask=rows)


def _check(lengths, queries, keys, kv_heads, compiled):
    """q of `queries`' positions against k, v of `keys`' (None: the whole rows), flex on CUDA vs the dense CPU path."""
    s = sum(lengths[0])
    g = torch.Generator().manual_seed(0)
    sq = s if queries is None else len(queries)
    q = torch.randn(3, 12, sq, 128, generator=g)
    k, v = (torch.randn(3, kv_heads, s, 128, generator=g) for _ in range(2))
    grad = torch.randn(3, 12, sq, 128, generator=g)
    ids = document_ids(lengths)
    ref_out, ref_grads = _run(_attend, q, k, v, grad, DocumentRows.of(ids, queries, keys))
    on_gpu = (None if t is None else t.cuda() for t in (queries, keys))
    rows = DocumentRows.of(ids.cuda(), *on_gpu)
    assert rows.block is not None
    fn = torch.compile(_attend) if compiled else _attend
    out, grads = _run(fn, *(t.cuda().bfloat16() for t in (q, k, v, grad)), rows)
    assert (out - ref_out).abs().max() / ref_out.abs().max() < 1e-2
    for got, want in zip(grads, ref_grads):
        assert (got - want).abs().max() / want.abs().max() < 1e-2


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("kv_heads", [12, 2])
def test_flex_path_equals_the_dense_cpu_reference(kv_heads, compiled):
    _check(LENGTHS, None, None, kv_heads, compiled)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("lengths", [LENGTHS, SHORT], ids=["whole_blocks", "partial_blocks"])
@pytest.mark.parametrize("rank", [0, 1])
def test_flex_path_of_a_context_parallel_rank_equals_the_dense_cpu_reference(rank, lengths, compiled):
    s = sum(lengths[0])
    _check(lengths, zigzag_index(s, 2, rank), gathered_order(s, 2), 2, compiled)
