"""A Whisper-style audio encoder: two 1-D convolutions over log-mel frames, positions, pre-LN blocks.

Names follow Hugging Face's WhisperEncoder (conv1, conv2, embed_positions, layers.N.self_attn_layer_norm,
final_layer_norm, layer_norm) so weights map one to one. Two deliberate differences, both renames only:
attention's output projection is `o_proj` and the MLP sits under `mlp.fc1`/`mlp.fc2`, the names the
tensor-parallel code shards in every other block. Unlike Whisper, any frame count up to
2 * max_positions is accepted, so batches need not be padded to 30 seconds.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from mimo.config.schema import AudioConfig
from mimo.models import init
from mimo.models.layers import MLP, SelfAttention


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed position table `[length, channels]`: sines then cosines over geometric timescales."""
    if channels % 2:
        raise ValueError(f"audio hidden size ({channels}) must be even for sinusoidal positions")
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv_timescales[None, :]
    return torch.cat([t.sin(), t.cos()], dim=1)


class AudioBlock(nn.Module):
    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.self_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.heads, qkv_bias=True, out_bias=True)
        # Whisper's key projection has no bias (a bias on keys cancels in the softmax anyway).
        self.self_attn.k_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.hidden, cfg.mlp, cfg.hidden, cfg.act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), causal=False)
        return x + self.mlp(self.final_layer_norm(x))


class AudioEncoder(nn.Module):
    """Log-mel features `[B, n_mels, T]` -> frame features `[B, T', hidden]`, T' = output_frames(T)."""

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.cfg = cfg
        self.conv1 = nn.Conv1d(cfg.n_mels, cfg.hidden, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(cfg.hidden, cfg.hidden, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): AudioBlock(cfg) for i in range(cfg.layers)})
        self.layer_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.init_weights()

    @staticmethod
    def output_frames(num_frames: int) -> int:
        """Frames left after the stride-2 convolution: how many rows one input of `num_frames` yields."""
        return (num_frames - 1) // 2 + 1

    def init_weights(self) -> None:
        """Normal(0, init_std) matrices, zero biases, unit norms; sinusoidal positions stay fixed unless learned."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Embedding)):
                init.normal_(m.weight, std=self.cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                init.ones_(m.weight)
                init.zeros_(m.bias)
        if not self.cfg.learned_positions:
            init.fixed_(self.embed_positions.weight,
                        functools.partial(sinusoids, self.cfg.max_positions, self.cfg.hidden))
            self.embed_positions.weight.requires_grad_(False)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        if input_features.dim() != 3 or input_features.shape[1] != self.cfg.n_mels:
            raise ValueError(f"input_features must be [B, n_mels={self.cfg.n_mels}, T], got shape "
                             f"{tuple(input_features.shape)}")
        x = F.gelu(self.conv1(input_features.to(self.conv1.weight.dtype)))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        if x.shape[1] > self.cfg.max_positions:
            raise ValueError(f"input_features has {input_features.shape[2]} frames, more than the "
                             f"{2 * self.cfg.max_positions} that max_positions={self.cfg.max_positions} covers; "
                             "cut the audio into shorter chunks")
        x = x + self.embed_positions.weight[: x.shape[1]].to(x.dtype)
        for layer in self.layers.values():
            x = layer(x)
        return self.layer_norm(x)
