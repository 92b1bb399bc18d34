"""Packed documents' attention (`DocumentRows`) against each document attended alone: whole rows, and (the CUDA
path's block mask, under eager FlexAttention) a context-parallel rank's zigzag queries."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import mimo.models.layers as layers
from mimo.models.layers import DocumentRows, attention, document_mask
from mimo.parallel.context import gathered_order, zigzag_index
from tests.support.documents import document_ids

LENGTHS = [[3, 5, 2], [10], [1, 4, 4, 1]]  # three rows of 10 positions


def each_document_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[list[int]]) -> torch.Tensor:
    """The oracle: every document of every row through causal SDPA on its own, written back in place."""
    out = torch.empty_like(q)
    rep = q.shape[1] // k.shape[1]
    for r, row in enumerate(lengths):
        at = 0
        for n in row:
            qs, ks, vs = (t[r:r + 1, :, at:at + n] for t in (q, k, v))
            out[r:r + 1, :, at:at + n] = F.scaled_dot_product_attention(
                qs, ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1), is_causal=True)
            at += n
    return out


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_packed_attention_equals_each_document_alone(kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 10, 8, generator=g)
    k, v = (torch.randn(3, kv_heads, 10, 8, generator=g) for _ in range(2))
    out = attention(q, k, v, causal=True, mask=DocumentRows.of(document_ids(LENGTHS)))
    torch.testing.assert_close(out, each_document_alone(q, k, v, LENGTHS), rtol=1e-6, atol=1e-6)


def test_dense_mask_is_the_document_mask_of_the_rows_in_order():
    ids = document_ids(LENGTHS)
    assert DocumentRows.of(ids).block is None  # off CUDA nothing but the ids
    assert torch.equal(DocumentRows.of(ids).dense(), document_mask(ids, torch.arange(10).expand(3, 10)))


@pytest.mark.filterwarnings("ignore:.*flex_attention.*")
@pytest.mark.parametrize("rank", [0, 1])
def test_block_mask_of_a_context_parallel_rank_gives_its_dense_attention(monkeypatch, rank):
    """The CUDA path's block mask for cp2 rank `rank`'s zigzag queries against the all-gathered keys (rows of 300
    positions: chunks of 75, so both q and k end in partial 128-blocks), run by eager FlexAttention on the CPU
    (forward only there), equals each document attended alone, read at those positions."""
    monkeypatch.setattr(layers, "_flex_kernels", lambda: (flex_attention, create_block_mask))
    lengths = [[100, 120, 80], [300], [1, 149, 150]]
    ids = document_ids(lengths)
    queries, keys = zigzag_index(300, 2, rank), gathered_order(300, 2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, 300, 8, generator=g) for h in (4, 2, 2))
    rows = DocumentRows(ids, queries, keys, layers.block_mask(ids, queries, keys))
    out = attention(q[:, :, queries], k[:, :, keys], v[:, :, keys], causal=True, mask=rows)
    torch.testing.assert_close(out, each_document_alone(q, k, v, lengths)[:, :, queries], rtol=1e-5, atol=1e-5)
    dense = DocumentRows(ids, queries, keys)
    torch.testing.assert_close(dense.attend(q[:, :, queries], k[:, :, keys], v[:, :, keys]), out, rtol=1e-5,
                               atol=1e-5)
