"""Building blocks shared by the LM and the encoders: norms, rotary embeddings, attention, MLPs.

Single-device code. Head counts are read from the projection shapes at run time (`view(..., -1, d)`),
so tensor parallelism can shard the projections from outside without touching these classes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mimo.config.schema import LLAMA3_ROPE_KEYS

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
    "relu": F.relu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{name}'; choose one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 like the reference implementations; with `offset` (Gemma) the
    scale is 1 + weight, so a zero weight is the identity."""

    def __init__(self, dim: int, eps: float = 1e-6, offset: bool = False):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return ((1.0 + self.weight.float()) * x).to(dtype)
        return self.weight * x.to(dtype)


def llama3_scaled_inv_freq(inv: torch.Tensor, scaling: dict[str, float]) -> torch.Tensor:
    """Llama 3 long-context RoPE: slow down long wavelengths by `factor`, keep short ones, blend between."""
    missing = [k for k in LLAMA3_ROPE_KEYS if k not in scaling]
    if missing or len(scaling) != len(LLAMA3_ROPE_KEYS):
        raise ValueError(f"model.llm.rope_scaling must have exactly the keys {list(LLAMA3_ROPE_KEYS)}, got "
                         f"{sorted(scaling)}; leave it empty for plain RoPE")
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 scaling: dict[str, float] | None = None,
                 mrope_section: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for integer positions `[B, S]`, shaped `[B, S, head_dim]` (half-split layout).

    `scaling` (optional) holds Llama 3 RoPE scaling parameters (see `llama3_scaled_inv_freq`). With
    `mrope_section` (Qwen2-VL's M-RoPE, sizes summing to head_dim / 2) positions may be `[B, S, 3]`
    (temporal, height, width): frequency section i turns with axis i % 3; `[B, S]` positions are the three
    axes alike, which is plain RoPE."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    if scaling:
        inv = llama3_scaled_inv_freq(inv, scaling)
    if mrope_section and positions.dim() == 3:
        axes = positions.float().movedim(-1, 0)[..., None] * inv  # [3, B, S, head_dim / 2]
        freqs = torch.cat([part[i % 3] for i, part in enumerate(axes.split(list(mrope_section), dim=-1))], dim=-1)
    else:
        freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[B, heads, S, D]` by position; cos/sin are `[B, S, D]`."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Keys and values of every layer for incremental decoding; one tensor pair per layer."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.k:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def length(self) -> int:
        return next(iter(self.k.values())).shape[2] if self.k else 0


def document_mask(query_docs: torch.Tensor, query_pos: torch.Tensor, key_docs: torch.Tensor | None = None,
                  key_pos: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, Sq]` document ids and `[B, Sq]` or `[Sq]` positions of the queries (keys: the same unless given) ->
    `[B, 1, Sq, Sk]` bool: a query sees the keys of its own document at or before its position.

    Positions are indices into the row, so the mask is causal whatever order the queries and keys come in
    (context parallel hands each rank a zigzag of queries and the keys in all-gathered order)."""
    if key_docs is None:
        key_docs, key_pos = query_docs, query_pos
    same = query_docs[:, :, None] == key_docs[:, None, :]
    return (same & (key_pos[..., None, :] <= query_pos[..., :, None]))[:, None]


_FLEX_BLOCK = 128
"""FlexAttention's block: its kernels take rows of a multiple of it."""


@functools.cache
def _flex_kernels() -> tuple:
    """FlexAttention and its block-mask builder, each compiled once per process: eager FlexAttention runs a
    reference kernel, and an uncompiled block-mask builder materialises the whole `[S, S]` mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return torch.compile(flex_attention, dynamic=False), torch.compile(create_block_mask, dynamic=False)


def _pad_to_block(t: torch.Tensor, value: int) -> torch.Tensor:
    """The last dim padded with `value` to a whole number of FlexAttention blocks."""
    return F.pad(t, (0, -t.shape[-1] % _FLEX_BLOCK), value=value)


def _pad_rows(t: torch.Tensor) -> torch.Tensor:
    """`[B, heads, S, D]` padded with zeros along S to whole FlexAttention blocks (itself when already whole)."""
    tail = -t.shape[2] % _FLEX_BLOCK
    return F.pad(t, (0, 0, 0, tail)) if tail else t


def block_mask(ids: torch.Tensor, queries: torch.Tensor | None = None, keys: torch.Tensor | None = None) -> object:
    """FlexAttention's block mask of `DocumentRows(ids, queries, keys)`, on `ids`' device, for q and k padded to
    whole 128-position blocks (as `DocumentRows.attend` pads them)."""
    if queries is None and keys is None:  # the whole row: its padded tail is a document (-1) no real query sees
        padded = _pad_to_block(ids, -1)

        def mask_mod(b, h, q, kv):
            return (padded[b, q] == padded[b, kv]) & (kv <= q)

        return _flex_kernels()[1](mask_mod, ids.shape[0], None, padded.shape[1], padded.shape[1], device=ids.device)
    row = torch.arange(ids.shape[1], device=ids.device)
    queries, keys = row if queries is None else queries, row if keys is None else keys
    # Padding keys are a document (-2) no query sees; padding queries (-1) see key 0 alone, so no row is empty.
    q_docs, k_docs = _pad_to_block(ids[:, queries], -1), _pad_to_block(ids[:, keys], -2)
    q_pos, k_pos = _pad_to_block(queries, 0), _pad_to_block(keys, 0)

    def positions_mask_mod(b, h, q, kv):
        own = (q_docs[b, q] == k_docs[b, kv]) & (k_pos[kv] <= q_pos[q])
        return own | ((q_docs[b, q] == -1) & (kv == 0))

    return _flex_kernels()[1](positions_mask_mod, ids.shape[0], None, q_docs.shape[1], k_docs.shape[1],
                              device=ids.device)


@dataclass(frozen=True)
class DocumentRows:
    """Rows packed with documents (mimo.data.packing) as an attention mask that a GPU step never builds densely.

    `ids` `[B, S]`: each position's document id in its row, the whole rows; a query sees its own document's keys at
    or before it. `queries` `[Sq]` and `keys` `[Sk]`: the row positions of the queries `attend` gets and of its keys,
    in their order (context parallel: this rank's zigzag queries against the all-gathered keys); None: the whole
    row in order. `of(...)` on CUDA adds `block`, FlexAttention's block-sparse form of that mask (built on the
    device once per forward and shared by every layer; blocks of other documents are skipped, nothing `[Sq, Sk]` is
    made), and `attend` runs FlexAttention over it; elsewhere `attend` is SDPA with the `dense` mask, the reference
    the tests compare against. FlexAttention was measured faster than variable-length flash attention on the
    presets' LM shapes (benchmarks/bench_packed_attention.py), and it reads grouped KV heads as they are."""

    ids: torch.Tensor
    queries: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    block: object | None = None

    @staticmethod
    def of(ids: torch.Tensor, queries: torch.Tensor | None = None, keys: torch.Tensor | None = None) -> DocumentRows:
        return DocumentRows(ids, queries, keys, block_mask(ids, queries, keys) if ids.is_cuda else None)

    def dense(self) -> torch.Tensor:
        """`[B, 1, Sq, Sk]` bool (`document_mask` of the queries' and keys' positions)."""
        row = torch.arange(self.ids.shape[1], device=self.ids.device)
        queries = row if self.queries is None else self.queries
        keys = row if self.keys is None else self.keys
        return document_mask(self.ids[:, queries], queries, self.ids[:, keys], keys)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention within each document: `[B, heads, Sq, D]` q against `[B, kv_heads, Sk, D]` k and v."""
        if self.block is None:
            return attention(q, k, v, causal=True, mask=self.dense())
        s = q.shape[2]
        q, k, v = (_pad_rows(t) for t in (q, k, v))
        out = _flex_kernels()[0](q, k, v, block_mask=self.block, enable_gqa=q.shape[1] != k.shape[1])
        return out[:, :, :s] if out.shape[2] != s else out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              mask: torch.Tensor | DocumentRows | None = None) -> torch.Tensor:
    """SDPA over `[B, heads, S, D]`; k and v may have fewer (grouped-query) heads than q.

    `mask` (bool, True = may attend, broadcastable to `[B, 1, Sq, Sk]`) replaces the causal flag when
    given; it is how packed documents and incremental decoding express their structure. Without a mask,
    SDPA shares each KV head over its query group itself (`enable_gqa`: the flash kernel reads the grouped
    heads, nothing is copied); the masked kernels need the heads repeated. Packed documents given as
    `DocumentRows` run its own kernel.
    """
    if isinstance(mask, DocumentRows):
        return mask.attend(q, k, v)
    gqa = q.shape[1] != k.shape[1]
    if mask is not None:
        if gqa:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                         mask: torch.Tensor | None, cap: float) -> torch.Tensor:
    """`attention` with Gemma 2's soft-capped scores, cap * tanh(scores / cap), before the mask and an fp32
    softmax (no fused kernel does this)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(2, 3)) / math.sqrt(q.shape[-1])
    scores = cap * torch.tanh(scores / cap)
    if mask is None and causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - q.shape[2])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


class SelfAttention(nn.Module):
    """Multi-head attention with optional grouped KV heads, qkv bias and rotary positions."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, qkv_bias: bool, out_bias: bool,
                 head_dim: int | None = None, qk_norm_eps: float | None = None, qk_norm_full: bool = False,
                 norm_offset: bool = False, query_scale: float = 0.0, softcap: float = 0.0):
        """`qk_norm_eps` adds RMS norms on q and k, per head, or with `qk_norm_full` over all heads at once
        (OLMo 2: weights `[heads * head_dim]`, applied before the heads are split); `norm_offset` makes them
        Gemma's (1 + weight). `query_scale` (0 = 1 / sqrt(head_dim)) is the factor on the attention scores:
        the queries are pre-multiplied so that the kernel's own 1 / sqrt(head_dim) gives it. `softcap` (Gemma 2)
        soft-caps the scores (`softcapped_attention`)."""
        super().__init__()
        self.head_dim = head_dim or hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=out_bias)
        self.qk_norm_full = qk_norm_full
        q_width, k_width = (heads * self.head_dim, kv_heads * self.head_dim) if qk_norm_full else (self.head_dim,) * 2
        self.q_norm = RMSNorm(q_width, qk_norm_eps, norm_offset) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(k_width, qk_norm_eps, norm_offset) if qk_norm_eps is not None else None
        self.query_factor = query_scale * math.sqrt(self.head_dim) if query_scale else 1.0
        # The attention kernel, `attention(q, k, v, causal, mask)` by default; a layout's in its place where the
        # model runtime gives one (`ModelRuntime.lm_attention`, through `DecoderLM.use_attention`: context
        # parallel attends local queries to keys and values gathered over its group).
        self.attention_fn = attention if not softcap else functools.partial(softcapped_attention, cap=softcap)
        self.layout_attention: Callable[..., torch.Tensor] | None = None
        self.fused_qkv = False  # `fuse_qkv()`

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                causal: bool = True, mask: torch.Tensor | None = None,
                cache: KVCache | None = None, layer: int = 0, rows: torch.Tensor | None = None) -> torch.Tensor:
        """`[B, S, hidden]`; with `rows` (indices into the flattened `B * S` positions) only those rows
        of the output, `[len(rows), hidden]`: every position is still a key and value, but the output
        projection runs on the rows asked for."""
        b, s, _ = x.shape
        d = self.head_dim
        q, k, v = self._qkv_in_one_product(x) if self.fused_qkv else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        if self.q_norm is not None and self.qk_norm_full:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.view(b, s, -1, d), k.view(b, s, -1, d), v.view(b, s, -1, d)
        if self.q_norm is not None and not self.qk_norm_full:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.query_factor != 1.0:
            q = q * self.query_factor
        if cache is not None:
            k, v = cache.append(layer, k, v)
        kernel = self.attention_fn if self.layout_attention is None else self.layout_attention
        out = kernel(q, k, v, causal=causal, mask=mask).transpose(1, 2).reshape(b, s, -1)
        if rows is not None:
            out = out.flatten(0, 1).index_select(0, rows)
        return self.o_proj(out)

    def fuse_qkv(self) -> None:
        """From now on q, k and v come from one product over their weights concatenated at each call (the fast
        path mimo.perf.fused_qkv installs); the parameters stay three linears."""
        self.fused_qkv = True

    def _qkv_in_one_product(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as slices of one product: one wider GEMM each way instead of three, and the input's
        gradient comes out of one product (the norm before it reads one tensor instead of summing three). A
        projection without a bias among ones with (Whisper's key) adds zeros in its place."""
        linears = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([lin.weight for lin in linears])
        bias = None if all(lin.bias is None for lin in linears) else torch.cat(
            [lin.weight.new_zeros(lin.weight.shape[0]) if lin.bias is None else lin.bias for lin in linears])
        return F.linear(x, weight, bias).split([lin.out_features for lin in linears], dim=-1)


class SwiGLU(nn.Module):
    """Gated MLP of Llama/Qwen (SiLU gate; Gemma's gate is `act` = "gelu_tanh")."""

    def __init__(self, hidden: int, inner: int, act: str = "silu", bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MLP(nn.Module):
    """Two linears with an activation between (ViT blocks, projectors)."""

    def __init__(self, dim_in: int, inner: int, dim_out: int, act: str, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(dim_in, inner, bias=bias)
        self.fc2 = nn.Linear(inner, dim_out, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def padding_causal_mask(key_mask: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """The keys' 0/1 (or bool) padding mask `[B, Sk]` (1 = real token) and the row positions of the queries
    `[Sq]` and of the keys `[Sk]` -> `[B, 1, Sq, Sk]` bool: causal, padded keys hidden.

    Every query may still see itself: a padding query would otherwise see no key at all, its softmax would
    be NaN, and the NaN would leak into real tokens through the next layer's masked-out values."""
    causal = key_pos[None, :] <= query_pos[:, None]
    itself = key_pos[None, :] == query_pos[:, None]
    return ((causal[None] & key_mask.bool()[:, None, :]) | itself[None])[:, None]


def sliding_window_mask(mask: torch.Tensor | None, window: int, queries: int, keys: int,
                        device: torch.device) -> torch.Tensor:
    """`mask` (bool `[B or 1, 1, queries, keys]`, None = causal) also hiding keys `window` or more positions
    behind their query; the queries are the last `queries` of the `keys` row positions (a KV cache's new ones)."""
    q_pos = torch.arange(keys - queries, keys, device=device)[:, None]
    k_pos = torch.arange(keys, device=device)[None, :]
    near = (q_pos - k_pos < window) & (k_pos <= q_pos)
    return near[None, None] if mask is None else mask & near


def padded_causal_mask(attention_mask: torch.Tensor, past: int = 0) -> torch.Tensor:
    """Causal mask that also hides padded keys, from a `[B, past + S]` 0/1 `attention_mask` (1 = real token)
    whose first `past` entries cover keys already in a KV cache: `[B, 1, S, past + S]` bool for the last S
    positions' queries (see `padding_causal_mask`)."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, S], got shape {tuple(attention_mask.shape)}")
    keys = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return padding_causal_mask(attention_mask, keys[past:], keys)
