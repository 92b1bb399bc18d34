"""A Llama/Qwen2/Qwen3-style decoder LM: RMSNorm, RoPE, grouped-query attention, SwiGLU (OLMo 2's norm
placement as an option).

The forward takes input *embeddings*, not token ids: the multimodal seam (MimoModel) builds the
embedding sequence, and pipeline stages after the first receive hidden states. Layers live in a
ModuleDict keyed by their global index so a pipeline stage can drop layers and keep stable names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mimo.config.schema import LLMConfig
from mimo.models import init
from mimo.models.layers import (
    DocumentRows,
    KVCache,
    RMSNorm,
    SelfAttention,
    SwiGLU,
    padded_causal_mask,
    rope_cos_sin,
    sliding_window_mask,
)
from mimo.models.moe import MoEFeedForward


class DecoderLayer(nn.Module):
    """Pre-norm (Llama/Qwen: `input_layernorm` before attention, `post_attention_layernorm` before the MLP);
    with `post_norm`, OLMo 2's: `post_attention_layernorm` on the attention output and
    `post_feedforward_layernorm` on the MLP output, each before its residual add; with `sandwich_norm`,
    Gemma's: both, plus `pre_feedforward_layernorm` before the MLP. Layer `index`'s `mlp` is a MoEFeedForward
    where `cfg.is_moe_layer(index)`."""

    def __init__(self, cfg: LLMConfig, index: int = 0):
        super().__init__()
        self.post_norm, self.sandwich = cfg.post_norm, cfg.sandwich_norm

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden, cfg.norm_eps, cfg.norm_offset)

        self.input_layernorm = None if cfg.post_norm else norm()
        self.self_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.kv_heads, qkv_bias=cfg.qkv_bias,
                                       out_bias=False, head_dim=cfg.attention_head_dim,
                                       qk_norm_eps=cfg.norm_eps if cfg.qk_norm else None, qk_norm_full=cfg.qk_norm_full,
                                       norm_offset=cfg.norm_offset, query_scale=cfg.query_scale,
                                       softcap=cfg.attn_softcap)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm() if cfg.sandwich_norm else None
        moe_count = sum(cfg.is_moe_layer(i) for i in range(cfg.layers))
        self.mlp = (MoEFeedForward(cfg, moe_count) if cfg.is_moe_layer(index)
                    else SwiGLU(cfg.hidden, cfg.mlp, cfg.mlp_act))
        self.post_feedforward_layernorm = norm() if cfg.post_norm or cfg.sandwich_norm else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None = None, cache: KVCache | None = None, layer: int = 0,
                rows: torch.Tensor | None = None, residual_rows: torch.Tensor | None = None) -> torch.Tensor:
        """`[B, S, H]`, or with `rows` (indices into the flattened `B * S` positions) `[len(rows), H]`:
        attention still reads every position, the rest of the layer runs on those rows only. `residual_rows`:
        the residual's own rows where they differ (sequence parallel: attention's output rows span the TP
        group's gathered positions, the residual holds this rank's shard; `DecoderLM.forward`)."""
        inp = x if self.input_layernorm is None else self.input_layernorm(x)
        h = self.self_attn(inp, rope=rope, causal=True, mask=mask, cache=cache, layer=layer, rows=rows)
        if rows is not None:
            x = x.flatten(0, 1).index_select(0, rows if residual_rows is None else residual_rows)
        if self.post_norm or self.sandwich:
            x = x + self.post_attention_layernorm(h)
            inner = x if self.pre_feedforward_layernorm is None else self.pre_feedforward_layernorm(x)
            return x + self.post_feedforward_layernorm(self.mlp(inner))
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


WeightLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""`(hidden [N, H], head weight [V, H], labels [N]) -> (loss sum, token count)`: see `DecoderLM.head_loss`."""


class LMHead(nn.Linear):
    """An untied LM head: a linear layer whose weight a loss can also take whole (`weight_loss`)."""

    def weight_loss(self, hidden: torch.Tensor, labels: torch.Tensor,
                    loss: WeightLoss) -> tuple[torch.Tensor, torch.Tensor]:
        """`loss(hidden, self.weight, labels)`: a method of the head, so that FSDP2 gathers a head sharded as a
        unit of its own around it (mimo.parallel.data's `own_entry_methods`)."""
        return loss(hidden, self.weight, labels)


class DecoderLM(nn.Module):
    """Decoder-only LM. `embed_tokens`, `norm` and `lm_head` may be None on pipeline stages."""

    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens: nn.Embedding | None = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, i) for i in range(cfg.layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.hidden, cfg.norm_eps, cfg.norm_offset)
        self.lm_head: nn.Linear | None = None if cfg.tie_embeddings else LMHead(cfg.hidden, cfg.vocab, bias=False)
        self.init_weights()

    @property
    def head_dim(self) -> int:
        return self.cfg.attention_head_dim

    def init_weights(self) -> None:
        """Normal(0, init_std) matrices, zero biases, unit norms: depends only on the RNG state."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                init.normal_(m.weight, std=self.cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                (init.zeros_ if m.offset else init.ones_)(m.weight)  # the identity either way

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(self.cfg.hidden**0.5, dtype=x.dtype) if self.cfg.embed_scale else x

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor | DocumentRows | None = None, cache: KVCache | None = None,
                output_rows: torch.Tensor | None = None, shard_rows: torch.Tensor | None = None,
                layers: list[str] | None = None) -> torch.Tensor:
        """Run this module's layers (and the final norm if present) over `[B, S, H]` hidden states at
        `position_ids` `[B, S]` (or `[B, S, 3]` with `mrope_section`: Qwen2-VL's M-RoPE, see `mimo.models.mrope`).

        `mask`: a bool `[B, 1, S, S_keys]` (True = may attend), a Hugging Face style `[B, past + S]` 0/1
        padding mask over the cached and the new positions, made causal here (`padded_causal_mask`), or packed
        rows' `DocumentRows`.

        `output_rows` (indices into the flattened `B * S` positions, e.g. those that carry a label) returns
        only those rows, `[len(output_rows), H]`: the last layer still attends over every position, but
        its output projection, MLP and the final norm skip the rest (image rows of a VLM, whose outputs
        no loss reads). The rows index this module's positions (a context-parallel rank's own). Under sequence
        parallelism `output_rows` index the TP group's gathered positions and `shard_rows` `[M]` the same rows
        among this rank's shard (every rank M of them, `mimo.parallel.tensor.sequence_parallel_rows`); the
        result is this rank's `[M, H]`.

        `layers`: the keys of the held layers to run, in order (one model chunk of an interleaved pipeline
        stage); the final norm then runs only if they end with the model's last layer. None: every held layer."""
        if output_rows is not None and not self.layers:
            raise ValueError("output_rows needs a decoder layer on this module to drop the other rows in; it has none")
        rope = rope_cos_sin(position_ids, self.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling,
                            self.cfg.mrope_section)
        past = cache.length() if cache is not None else 0
        if isinstance(mask, DocumentRows) and (self.cfg.layer_types or self.cfg.attn_softcap):
            mask = mask.dense()  # sliding windows and soft-capped scores are applied to a dense mask
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            if mask.shape != (hidden.shape[0], past + hidden.shape[1]):
                raise ValueError(f"a [B, S] attention mask must cover the cached and the new positions, "
                                 f"{(hidden.shape[0], past + hidden.shape[1])}; got {tuple(mask.shape)}")
            mask = padded_causal_mask(mask, past)
        elif past and mask is None:
            # Incremental decoding: new queries sit after `past` cached keys (bottom-right causal).
            s = hidden.shape[1]
            q_pos = torch.arange(s, device=hidden.device) + past
            mask = torch.arange(past + s, device=hidden.device)[None, :] <= q_pos[:, None]
        local_rope, local_mask = self._sliding_window(position_ids, mask, hidden.shape[1], past, hidden.device)
        keys = list(self.layers.keys()) if layers is None else layers
        last = keys[-1] if keys else None
        for key in keys:
            layer = self.layers[key]
            sliding = bool(self.cfg.layer_types) and self.cfg.layer_types[int(key)] == "sliding"
            hidden = layer(hidden, local_rope if sliding else rope, mask=local_mask if sliding else mask, cache=cache,
                           layer=int(key), rows=output_rows if key == last else None,
                           residual_rows=shard_rows if key == last else None)
        if self.norm is not None and (layers is None or last == str(self.cfg.layers - 1)):
            hidden = self.norm(hidden)
        return hidden

    def _sliding_window(self, position_ids: torch.Tensor, mask: torch.Tensor | None, s: int, past: int,
                        device: torch.device) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, torch.Tensor | None]:
        """RoPE and mask of the sliding-window layers (None when there are none): keys within
        `sliding_window` row positions of their query, and RoPE at `rope_local_theta`."""
        if "sliding" not in self.cfg.layer_types:
            return None, None
        theta = self.cfg.rope_local_theta or self.cfg.rope_theta
        rope = rope_cos_sin(position_ids, self.head_dim, theta, self.cfg.rope_scaling, self.cfg.mrope_section)
        return rope, sliding_window_mask(mask, self.cfg.sliding_window, s, past + s, device)

    def use_attention(self, kernel: Callable[..., torch.Tensor] | None) -> None:
        """Every layer's attention through `kernel` (`attention`'s contract; a layout's, see
        `ModelRuntime.lm_attention`), or (None) through its own. Called by `MimoModel.set_runtime`."""
        for module in self.modules():
            if isinstance(module, SelfAttention):
                module.layout_attention = kernel

    def head_loss(self, hidden: torch.Tensor, labels: torch.Tensor,
                  loss: WeightLoss) -> tuple[torch.Tensor, torch.Tensor]:
        """`loss(hidden, W, labels)` of the head's weight W `[V, H]` (the tied embedding's, or an untied head's
        through its `weight_loss`): a loss that never forms the logits (mimo.perf's chunked loss). A method of
        the LM and of the head, so FSDP2 gathers either where it shards them (their entry methods)."""
        if self.lm_head is None:
            return loss(hidden, self.embed_tokens.weight, labels)
        return self.lm_head.weight_loss(hidden, labels, loss)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden @ W^T`, soft-capped with `logit_softcap` (Gemma 2). An untied head is called as a module,
        so hooks on it (FSDP2's gather of a sharded head) run around the product; a tied head is the
        embedding's weight."""
        out = hidden @ self.embed_tokens.weight.t() if self.lm_head is None else self.lm_head(hidden)
        cap = self.cfg.logit_softcap
        return cap * torch.tanh(out / cap) if cap else out
