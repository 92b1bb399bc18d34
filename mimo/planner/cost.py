"""Compute and communication time of one module's piece, per microbatch, from a device profile.

A transformer layer's time is the sum of its parts, each from the profile's fitted lines
(mimo.planner.profile), times the profile's measured `layer_factor` of that kind:

- matrix products, per rank: the forward's q/k/v (one product with `perf.fuse_qkv`), output, and MLP
  products at [tokens, n / tp] (a decoder's gate, up and down, a MoE feed-forward's unsplit, as it runs
  TP-replicated; an encoder's two), the backward each twice (input and weight gradient; a frozen module's
  weight gradient is skipped);
- attention: `mimo.models.flops`'s count (causal at half, the LM's over cp), / tp, backward
  `attention_backward_ratio` times the forward;
- element-wise traffic: ~40 bytes x hidden per token (norms, residuals, RoPE, casts) plus the MLP
  activation's 6 (decoder) or 4 (encoder) bytes per unit, / tp where the tensor is sharded; the backward 2x;
- fixed: 14 kernels forward, 28 backward, each `kernel_s` on the GPU; the host issues each in `launch_s`, and
  a layer takes the longer of the two (the host runs ahead of the GPU).

Communication inside a module (not overlapped: mimo runs it on the compute stream): tensor parallelism
all-reduces the layer's activation twice in the forward and twice in the backward (a reduce-scatter and
an all-gather each under sequence parallelism: the same bytes); context parallelism all-gathers the
layer's keys and values over cp in the forward and reduce-scatters their gradient in the backward; expert
parallelism exchanges each MoE layer's routed rows (dispatch and combine) over its ep ranks each way.

Beside the layers: the LM's head and loss on its last stage (on the loss rows only with
`perf.loss_rows_only`; bf16 chunks with `perf.chunked_loss`, else fp32 logits), a ViT's patch
embedding, an audio encoder's convolutions, and each modality's projector.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo.config.schema import LANGUAGE, Config, ModuleLayoutConfig
from mimo.models.audio import AudioEncoder
from mimo.models.audio_features import WHISPER_HOP
from mimo.parallel.grid import Grid
from mimo.planner.network import Network
from mimo.planner.profile import Profile
from mimo.tasks import data_set

KERNELS_FORWARD, KERNELS_BACKWARD = 14, 28
"""Kernels one transformer layer launches (eager; a compiled layer launches fewer, which layer_factor covers)."""


@dataclass(frozen=True)
class Piece:
    """One microbatch through one rank's piece of a module: seconds of compute and of communication."""

    forward_s: float
    backward_s: float
    forward_comm_s: float = 0.0
    backward_comm_s: float = 0.0

    @property
    def forward(self) -> float:
        return self.forward_s + self.forward_comm_s

    @property
    def backward(self) -> float:
        return self.backward_s + self.backward_comm_s

    def __add__(self, other: Piece) -> Piece:
        return Piece(self.forward_s + other.forward_s, self.backward_s + other.backward_s,
                     self.forward_comm_s + other.forward_comm_s, self.backward_comm_s + other.backward_comm_s)


def matmul_s(p: Profile, m: float, n: float, k: float) -> float:
    """One [m, k] x [k, n] product."""
    return p.matmul_fixed_s + 2 * m * n * k / (p.matmul_tflops * 1e12) if m * n * k > 0 else 0.0


def attention_s(p: Profile, flop: float) -> float:
    return p.attention_fixed_s + flop / (p.attention_tflops * 1e12) if flop > 0 else 0.0


def memory_s(p: Profile, nbytes: float) -> float:
    return nbytes / (p.memory_gbps * 1e9)


def inputs_per_sample(cfg: Config, name: str) -> float:
    """Average inputs (images, clips) of modality `name` per sample of the config's data."""
    return data_set(cfg).inputs_per_sample(cfg, cfg.model.modalities[name].kind)


def audio_frames(cfg: Config, name: str) -> int:
    """Mel frames of one clip as the encoder runs it (padded)."""
    return data_set(cfg).clip_samples(cfg, cfg.model.modalities[name].audio.max_positions) // WHISPER_HOP


def encoder_positions(cfg: Config, name: str) -> int:
    """Positions one input runs through the encoder's blocks."""
    m = cfg.model.modalities[name]
    return AudioEncoder.output_frames(audio_frames(cfg, name)) if m.kind == "audio" else m.vit.positions


def encoder_rows(cfg: Config, name: str) -> int:
    """Rows one input hands the LM (the placeholders it fills)."""
    m = cfg.model.modalities[name]
    return encoder_positions(cfg, name) if m.kind == "audio" else m.vit.tokens_per_image


def _layer(p: Profile, kind: str, tokens: float, hidden: int, products: list[tuple[float, float]],
           attn_flop: float, mlp_bytes: float, sp_tp: int, frozen: bool, cfg: Config) -> Piece:
    """One transformer layer: `products` are (n, k) of each forward product at `tokens` rows."""
    fwd = sum(matmul_s(p, tokens, n, k) for n, k in products)
    bwd = fwd * (1 if frozen else 2)
    elem = memory_s(p, tokens * (40 * hidden / sp_tp + mlp_bytes))
    fwd += attention_s(p, attn_flop) + elem + KERNELS_FORWARD * p.kernel_s
    bwd += p.attention_backward_ratio * attention_s(p, attn_flop) + 2 * elem + KERNELS_BACKWARD * p.kernel_s
    # the host issues every kernel; the GPU waits when it is slower
    fwd, bwd = max(fwd, KERNELS_FORWARD * p.launch_s), max(bwd, KERNELS_BACKWARD * p.launch_s)
    factor = p.factor(kind, cfg.perf.compile)
    return Piece(fwd * factor, bwd * factor)


def _tp_comm(net: Network, grid: Grid, nbytes: float) -> float:
    """Two all-reduces of `nbytes` over the module's first TP group."""
    return 2 * net.all_reduce(nbytes, grid.offset, 1, grid.tp)


def decoder_layer(cfg: Config, p: Profile, net: Network, grid: Grid, flags: ModuleLayoutConfig,
                  samples: float, seq: int, moe: bool = False) -> Piece:
    """One LM layer over `samples` sequences of `seq` tokens on one rank of `grid` (`moe`: its feed-forward
    is the mixture of experts, see `_moe_products`)."""
    llm, tp, cp = cfg.model.llm, grid.tp, grid.cp
    hd, tokens = llm.attention_head_dim, samples * seq / cp
    q, kv = llm.heads * hd / tp, llm.kv_heads * hd / tp
    qkv = [(q + 2 * kv, llm.hidden)] if cfg.perf.fuse_qkv else [(q, llm.hidden), (kv, llm.hidden), (kv, llm.hidden)]
    mlp = llm.mlp / tp
    dense = [(mlp, llm.hidden), (mlp, llm.hidden), (llm.hidden, mlp)]
    products = qkv + [(llm.hidden, q)] + ([] if moe else dense)
    attn = samples * 2 * seq * seq * llm.heads * hd / (tp * cp)
    sp_tp = tp if flags.sequence_parallel else 1
    width = llm.moe_top_k * llm.moe_mlp if moe else mlp  # the MoE runs TP-replicated
    piece = _layer(p, "decoder", tokens, llm.hidden, products, attn, 6 * width, sp_tp, cfg.model.freeze_llm, cfg)
    act = tokens * llm.hidden * (4 if cfg.precision.dtype_of(LANGUAGE) == "float32" else 2)
    comm = _tp_comm(net, grid, act)
    kv_bytes = 2 * samples * seq * kv * 2
    cp_comm = net.all_gather(kv_bytes, grid.offset, tp, cp)
    piece = piece + Piece(0.0, 0.0, comm + cp_comm, comm + cp_comm)
    return piece + _moe_feed_forward(cfg, p, net, grid, flags, tokens) if moe else piece


def _moe_feed_forward(cfg: Config, p: Profile, net: Network, grid: Grid, flags: ModuleLayoutConfig,
                      tokens: float) -> Piece:
    """A mixture-of-experts feed-forward on one rank: the router, each local expert's three products over its
    share of the routed rows (balanced loads: tokens x top_k x ep / experts rows each, experts / ep of them), the
    shared expert, and the dispatch and combine all-to-alls over the ep group (each way, forward and backward).
    Nothing of it is split by tp: mimo.parallel.tensor runs the MoE TP-replicated on the replicated input."""
    llm, ep = cfg.model.llm, max(flags.ep, 1)
    h, rows = llm.hidden, tokens * llm.moe_top_k * ep / llm.moe_experts
    fwd = matmul_s(p, tokens, llm.moe_experts, h)
    fwd += llm.moe_experts / ep * (2 * matmul_s(p, rows, llm.moe_mlp, h) + matmul_s(p, rows, h, llm.moe_mlp))
    if llm.moe_shared_mlp:
        shared = llm.moe_shared_mlp
        fwd += 2 * matmul_s(p, tokens, shared, h) + matmul_s(p, tokens, h, shared)
    routed = tokens * llm.moe_top_k * h * 2
    exchange = 2 * net.all_to_all(routed, grid.offset, grid.tp * grid.cp, ep)
    factor = p.factor("decoder", cfg.perf.compile)
    return Piece(fwd * factor, fwd * factor * (1 if cfg.model.freeze_llm else 2), exchange, exchange)


def encoder_layer(cfg: Config, p: Profile, net: Network, name: str, grid: Grid, inputs: float) -> Piece:
    """One encoder block over `inputs` images or clips on one rank of `grid`."""
    m = cfg.model.modalities[name]
    shape = m.audio if m.kind == "audio" else m.vit
    tp, h, positions = grid.tp, shape.hidden, encoder_positions(cfg, name)
    tokens = inputs * positions
    qkv = [(3 * h / tp, h)] if cfg.perf.fuse_qkv else [(h / tp, h)] * 3
    products = qkv + [(h, h / tp), (shape.mlp / tp, h), (h, shape.mlp / tp)]
    attn = inputs * 4 * positions * positions * h / tp
    frozen = m.freeze_encoder
    piece = _layer(p, "audio" if m.kind == "audio" else "vit", tokens, h, products, attn, 4 * shape.mlp / tp, 1,
                   frozen, cfg)
    act = tokens * h * (4 if cfg.precision.dtype_of(name) == "float32" else 2)
    comm = _tp_comm(net, grid, act)
    return piece + Piece(0.0, 0.0, comm, comm)


def encoder_edges(cfg: Config, p: Profile, name: str, inputs: float) -> Piece:
    """An encoder's patch embedding or convolutions and its projector (whole on every rank)."""
    m, lm_h = cfg.model.modalities[name], cfg.model.llm.hidden
    if m.kind == "audio":
        frames, a = audio_frames(cfg, name), m.audio
        fwd = matmul_s(p, inputs * frames, a.hidden, 3 * a.n_mels)
        fwd += matmul_s(p, inputs * AudioEncoder.output_frames(frames), a.hidden, 3 * a.hidden)
        width = a.hidden
    else:
        v = m.vit
        fwd = matmul_s(p, inputs * (v.image // v.patch) ** 2, v.hidden, v.channels * v.patch ** 2)
        width = v.hidden
    rows = inputs * encoder_rows(cfg, name)
    fwd += matmul_s(p, rows, lm_h, width) + matmul_s(p, rows, lm_h, lm_h) + memory_s(p, rows * (width + 2 * lm_h) * 4)
    return Piece(fwd, 2 * fwd)


def lm_head(cfg: Config, p: Profile, net: Network, grid: Grid, samples: float, seq: int, text_rows: float) -> Piece:
    """The LM's final norm, output head and loss on its last stage, over one microbatch of one rank."""
    llm, tp = cfg.model.llm, grid.tp
    rows = samples * (text_rows if cfg.perf.loss_rows_only else seq) / grid.cp
    fwd = matmul_s(p, rows, llm.vocab / tp, llm.hidden)
    per_logit = 6 if cfg.perf.chunked_loss else 16
    loss = memory_s(p, rows * llm.vocab / tp * per_logit)
    stats = 2 * net.all_reduce(rows * 8, grid.offset, 1, tp)  # vocabulary-parallel softmax statistics
    return Piece(fwd + loss, 2 * fwd + loss, stats, stats)
