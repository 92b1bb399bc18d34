"""Model FLOPs of one training step, from the model config and the global batch's shapes.

The convention is the benchmark baseline's (benchmarks/baseline/hf_vlm_baseline.py,
`train_flops_per_sample`), so `mimo train` and the benchmarks report the same MFU:

- a matmul costs 2 FLOPs per multiply-add; norms, activations, biases, softmax and embedding lookups
  are free;
- attention score and value products are counted in full for bidirectional encoders and at half for
  the causal LM (flash kernels skip the masked half); a packed row counts as one causal sequence;
- a training step is 3 x forward (backward = 2 x forward), for every module, frozen or not: a frozen
  module does skip its weight gradients, but the baseline counts it in full and so does this.

Per module type, forward FLOPs:

- LM, per sample of S tokens: 2 (layers * layer_params + hidden * vocab) S + layers * 2 S^2 (heads *
  head_dim), layer_params = q and o (2 hidden heads head_dim) + k and v (2 hidden kv_heads head_dim) +
  SwiGLU (3 hidden mlp); on a mixture-of-experts layer the SwiGLU's place is taken by what a token
  passes: the router (hidden experts), top_k experts (3 hidden moe_mlp each) and the shared expert
  (3 hidden moe_shared_mlp, + hidden for its gate). The output head counts even when tied to the embedding.
- ViT, per image: 2 vit_params s + layers * 4 s^2 hidden, s = patches (+ the class token),
  vit_params = layers (4 hidden^2 + 2 hidden mlp) + channels patch^2 hidden (the patch conv).
- Whisper-style audio encoder, per clip of T mel frames padded as given (the encoder runs over the
  padding): the same rule, each weight counted at the positions it runs at: conv1 (3 n_mels hidden)
  at T frames, conv2 (3 hidden^2) and the blocks at T' = (T - 1) // 2 + 1 positions, attention
  layers * 4 T'^2 hidden. It leaves out the same things as the ViT rule does.
- Projector, per row it projects: 2 (in * lm_hidden + lm_hidden^2).
- Anyres image (LLaVA-NeXT tiles, mimo.models.anyres), per image: the ViT and the projector over each of its
  tiles (`tile_count` of its size: the overview tile and the grid's), every tile's rows projected; the unpadding,
  OneVision's shrink and the newline rows are free (no matmul).
- Native-resolution tower (Qwen2-VL), per item of N = t h w patches: 2 N (channels T P^2 hidden + layers (4 hidden^2
  + SwiGLU's 3 or the MLP's 2 hidden mlp)), attention 4 hidden sum(segment^2) per layer over its segments (a frame,
  or a window of it outside the full-attention layers), and the merger 2 (N / merge^2) ((merge^2 hidden)^2 +
  merge^2 hidden lm_hidden).

Not counted: the Out path's output projections and decoders, and the stand-in input an encoder runs
on when a microbatch holds none of its inputs (no model work).

Only shapes and host-side integers are read (the global batch is built on the host), so the trainer
can call it every step without waiting for the device.
"""

from __future__ import annotations

import torch

from mimo.config.schema import LANGUAGE, AudioConfig, LLMConfig, ModalityConfig, ModelConfig, NativeViTConfig, ViTConfig
from mimo.models.anyres import image_layout, tile_count
from mimo.models.audio import AudioEncoder
from mimo.models.sample_rows import OUTPUT_LENGTHS

TRAIN_FACTOR = 3  # forward + backward, backward = 2 x forward


def feed_forward_params(cfg: LLMConfig, layer: int) -> int:
    """Matmul weights one token passes in layer `layer`'s feed-forward: the SwiGLU, or on a mixture-of-experts
    layer the router, its k active experts and the shared expert with its gate."""
    h = cfg.hidden
    if not cfg.is_moe_layer(layer):
        return 3 * h * cfg.mlp
    shared = 3 * h * cfg.moe_shared_mlp + (h if cfg.moe_shared_gate else 0)
    return h * cfg.moe_experts + cfg.moe_top_k * 3 * h * cfg.moe_mlp + shared


def lm_flops(cfg: LLMConfig, seq: int) -> int:
    """Forward FLOPs of one causal LM sequence of `seq` tokens (active experts only on MoE layers)."""
    h, head_dim = cfg.hidden, cfg.attention_head_dim
    attention_params = 2 * h * cfg.heads * head_dim + 2 * h * cfg.kv_heads * head_dim
    weights = sum(attention_params + feed_forward_params(cfg, i) for i in range(cfg.layers))
    return 2 * (weights + h * cfg.vocab) * seq + cfg.layers * 2 * seq * seq * cfg.heads * head_dim


def encoder_flops(params: int, positions: int, layers: int, hidden: int) -> int:
    """Forward FLOPs of a bidirectional transformer over one input: weights times positions, full attention."""
    return 2 * params * positions + layers * 4 * positions * positions * hidden


def block_params(hidden: int, mlp: int, layers: int) -> int:
    """Matmul weights of pre-LN encoder blocks: q, k, v, o and a two-matrix MLP."""
    return layers * (4 * hidden * hidden + 2 * hidden * mlp)


def vit_flops(cfg: ViTConfig) -> int:
    """Forward FLOPs of one image."""
    params = block_params(cfg.hidden, cfg.mlp, cfg.layers) + cfg.channels * cfg.patch ** 2 * cfg.hidden
    return encoder_flops(params, cfg.positions, cfg.layers, cfg.hidden)


def audio_flops(cfg: AudioConfig, frames: int) -> int:
    """Forward FLOPs of one clip of `frames` mel frames (padding included)."""
    positions = AudioEncoder.output_frames(frames)
    conv = 2 * 3 * cfg.n_mels * cfg.hidden * frames + 2 * 3 * cfg.hidden * cfg.hidden * positions
    return conv + encoder_flops(block_params(cfg.hidden, cfg.mlp, cfg.layers), positions, cfg.layers, cfg.hidden)


def projector_flops(dim_in: int, lm_hidden: int, rows: int) -> int:
    """Forward FLOPs of the two-layer MLP projector over `rows` rows."""
    return 2 * (dim_in * lm_hidden + lm_hidden * lm_hidden) * rows


def anyres_flops(m: ModalityConfig, size: tuple[int, int], lm_hidden: int, tiled: bool = True) -> int:
    """Forward FLOPs of one image of `size` (height, width) of an anyres modality `m`: its tiles' ViT and projector
    (one tile when not `tiled`, mimo.models.anyres.tiled_images)."""
    tiles = tile_count(size, m.vit.image, m.anyres_grid_pinpoints, tiled)
    return tiles * (vit_flops(m.vit) + projector_flops(m.vit.hidden, lm_hidden, m.vit.tokens_per_image))


def _square_sum(length: int, chunk: int) -> int:
    """Sum of squared chunk lengths when `length` is cut into runs of `chunk` (the last one shorter)."""
    full, rest = divmod(length, chunk)
    return full * chunk * chunk + rest * rest


def native_flops(cfg: NativeViTConfig, grid: tuple[int, int, int], lm_hidden: int) -> int:
    """Forward FLOPs of one image or video of `grid` (temporal, rows, columns patches), merger included."""
    t, h, w = grid
    n, d, wide = t * h * w, cfg.hidden, cfg.hidden * cfg.merge**2
    mlp = (3 if cfg.family == "qwen2_5_vl" else 2) * d * cfg.mlp
    weights = cfg.patch_pixels * d + cfg.layers * (4 * d * d + mlp)
    side = cfg.window // cfg.merge // cfg.patch * cfg.merge if cfg.family == "qwen2_5_vl" and cfg.window else 0
    full = cfg.layers if not side else len(set(cfg.full_attention_layers))
    windowed = t * _square_sum(h, side) * _square_sum(w, side) if side else 0
    attention = 4 * d * (full * t * (h * w) ** 2 + (cfg.layers - full) * windowed)
    return 2 * weights * n + attention + 2 * (n // cfg.merge**2) * (wide * wide + wide * lm_hidden)


def modality_flops(cfg: ModelConfig, name: str, encoder_inputs: dict[str, dict[str, torch.Tensor]]) -> int:
    """Forward FLOPs of one modality's encoder and projector over all its inputs in the batch."""
    m, lm_hidden = cfg.modalities[name], cfg.llm.hidden
    kwargs = next(iter(encoder_inputs.values()), {})
    if m.kind == "audio":
        features = kwargs["input_features"]
        n, frames = features.shape[0], features.shape[-1]
        lengths = kwargs.get(OUTPUT_LENGTHS)
        rows = int(lengths.sum()) if lengths is not None else n * AudioEncoder.output_frames(frames)
        return n * audio_flops(m.audio, frames) + projector_flops(m.audio.hidden, lm_hidden, rows)
    if m.kind == "native_vision":
        return sum(native_flops(m.native, tuple(g), lm_hidden) for g in kwargs["grid_thw"].tolist())
    if m.anyres_grid_pinpoints:
        return sum(anyres_flops(m, s, lm_hidden, t) for s, t in zip(*image_layout(kwargs)))
    n = next((v.shape[0] for v in kwargs.values() if isinstance(v, torch.Tensor)), 0)
    return n * vit_flops(m.vit) + projector_flops(m.vit.hidden, lm_hidden, n * m.vit.tokens_per_image)


def module_step_flops(cfg: ModelConfig, batch: dict) -> dict[str, int]:
    """Model FLOPs of one training step (forward + backward) over a global batch by module (ModelConfig.module_names:
    the LM, then each modality with its inputs in the batch: its encoder and projector). The batch: `input_ids`
    `[B, S]` and `modality_inputs` `{modality: {encoder: {kwarg: tensor}}}` (the keys MimoModel.forward takes)."""
    samples, seq = batch["input_ids"].shape
    out = {LANGUAGE: TRAIN_FACTOR * samples * lm_flops(cfg.llm, seq)}
    for name, encoder_inputs in batch.get("modality_inputs", {}).items():
        out[name] = TRAIN_FACTOR * modality_flops(cfg, name, encoder_inputs)
    return out


def train_step_flops(cfg: ModelConfig, batch: dict) -> int:
    """Model FLOPs of one training step over a global batch: `module_step_flops` summed."""
    return sum(module_step_flops(cfg, batch).values())
