"""The typed config tree: one dataclass per section, the constants every floor shares, `ConfigError`.

`mimo.config.load` reads TOML and dotted overrides into these classes; `mimo.config.validate` checks the
fields that depend on one another. The `train` section, `TrainConfig`, is in mimo.config.train_config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mimo.config.train_config import TrainConfig

LANGUAGE = "language"
"""The language model's name among the modules (layouts, dtypes, checkpointing)."""


COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
"""torch.compile backends `train.compile_backend` takes: inductor generates fused kernels; aot_eager traces the
same graphs (Dynamo, then AOTAutograd's joint forward-backward, with the collectives and the checkpointed
recompute) but runs them with eager kernels; eager stops after Dynamo's capture."""

LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
"""The keys of model.llm.rope_scaling (Llama 3's long-context RoPE), as in Hugging Face's rope_scaling."""


@dataclass
class LLMConfig:
    """A Llama/Qwen2-style decoder."""

    vocab: int = 320
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    mlp: int = 384
    qkv_bias: bool = True
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    max_seq: int = 4096
    init_std: float = 0.02
    qk_norm: bool = False
    # OLMo 2: the q/k norms span all heads at once (weights [heads * head_dim]) rather than each head.
    qk_norm_full: bool = False
    # OLMo 2: each block normalises its attention and MLP outputs before the residual add, not their inputs.
    post_norm: bool = False
    # Gemma 3: norms before and after both attention and MLP; RMSNorm scales by (1 + weight); embeddings times
    # sqrt(hidden); the MLP gate's activation; attention scores times query_scale (0 = 1 / sqrt(head_dim)).
    sandwich_norm: bool = False
    norm_offset: bool = False
    embed_scale: bool = False
    mlp_act: str = "silu"
    query_scale: float = 0.0
    # Sliding-window attention (Gemma 3): layers marked "sliding" in layer_types (one entry per layer; empty = all
    # "full") see the sliding_window most recent positions, with RoPE theta rope_local_theta (0 = rope_theta).
    sliding_window: int = 0
    layer_types: list[str] = field(default_factory=list)
    rope_local_theta: float = 0.0
    # Gemma 2: attention scores and output logits soft-capped, cap * tanh(x / cap) (0 = none).
    attn_softcap: float = 0.0
    logit_softcap: float = 0.0
    # 0 = hidden // heads; Qwen3 checkpoints set it explicitly.
    head_dim: int = 0
    # Llama 3 RoPE scaling, keys as in HF's rope_scaling (LLAMA3_ROPE_KEYS: factor, low_freq_factor,
    # high_freq_factor, original_max_position_embeddings); empty = plain RoPE.
    rope_scaling: dict[str, float] = field(default_factory=dict)
    # Qwen2-VL's M-RoPE: the rotary frequencies split into (temporal, height, width) sections of these sizes (summing
    # to head_dim / 2), each rotated by its own axis of `[B, S, 3]` position ids; empty = one-axis RoPE.
    mrope_section: list[int] = field(default_factory=list)
    # The Hugging Face family an export writes ("qwen2", "qwen3", "llama", "mistral", "phi3", "olmo2"); "" = the one
    # the fields
    # above imply. Import sets it to the checkpoint's.
    family: str = ""
    # A Hugging Face Qwen2/Qwen3/Llama/Mistral directory: its config.json replaces the fields above and its weights
    # load.
    hf_path: str = ""
    # Tokens added to hf_path's vocabulary and the run's tokenizer at ids vocab_size + i (e.g. ["<image>"]).
    extra_tokens: list[str] = field(default_factory=list)
    # Mixture of experts (mimo/models/moe.py): moe_experts routed experts (0 = dense) of width moe_mlp, each token to
    # moe_top_k of them, on every moe_every-th layer (layer i when (i + 1) % moe_every == 0) except moe_dense_layers.
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_mlp: int = 0
    moe_every: int = 1
    moe_dense_layers: list[int] = field(default_factory=list)
    # A shared expert (a SwiGLU of this width, 0 = none) every token passes, with Qwen2-MoE's sigmoid gate.
    moe_shared_mlp: int = 0
    moe_shared_gate: bool = False
    # "softmax": top-k of the softmax (moe_norm_topk renormalises the k weights to sum 1); "sigmoid": top-k of
    # sigmoid scores plus a bias that is not trained but moved by moe_bias_rate toward balanced loads each step.
    moe_gating: str = "softmax"
    moe_norm_topk: bool = False
    moe_bias_rate: float = 0.0
    # Router losses' weights in the objective: the load-balancing loss and the z-loss (see mimo/models/moe.py).
    moe_aux_loss_weight: float = 0.0
    moe_z_loss_weight: float = 0.0

    @property
    def extra_token_ids(self) -> dict[str, int]:
        """{token: id} of extra_tokens, the last rows of a resolved config's vocab (hf_path's vocab_size + i)."""
        base = self.vocab - len(self.extra_tokens)
        return {token: base + i for i, token in enumerate(self.extra_tokens)}

    @property
    def attention_head_dim(self) -> int:
        """The width of one attention head: `head_dim` when set, else hidden // heads."""
        return self.head_dim or self.hidden // self.heads

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) has the mixture-of-experts feed-forward instead of the dense SwiGLU."""
        return self.moe_experts > 0 and (layer + 1) % self.moe_every == 0 and layer not in self.moe_dense_layers


@dataclass
class ViTConfig:
    """A CLIP-style vision transformer (pre-LN, GELU MLP, biases, class token, learned positions)."""

    image: int = 32
    patch: int = 8
    channels: int = 3
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    mlp: int = 256
    act: str = "gelu"
    norm_eps: float = 1e-5
    drop_class_token: bool = True
    init_std: float = 0.02
    # SigLIP-style towers: no class token, no pre-LayerNorm, a patch-embedding bias, a final LayerNorm.
    class_token: bool = True
    pre_norm: bool = True
    patch_bias: bool = False
    post_norm: bool = False
    # LLaVA's "default" feature strategy on a tower without a class token (SigLIP): transformers drops the
    # first output token whatever it is, here the first patch. A class-token tower uses drop_class_token.
    drop_first_patch: bool = False
    # DINOv2: a learned per-channel scale on each block's attention and MLP outputs (layer_scale1, layer_scale2).
    layer_scale: bool = False
    # SigLIP2: the patch embedding is a linear over each patch's pixels flattened (row, column, channel).
    patch_linear: bool = False

    @property
    def positions(self) -> int:
        """Tokens the blocks attend over: the patches, and the class token if there is one."""
        return (self.image // self.patch) ** 2 + int(self.class_token)

    @property
    def drops_first_token(self) -> bool:
        """Whether the first output token (the class token, or without one the first patch) is dropped."""
        return self.drop_class_token if self.class_token else self.drop_first_patch

    @property
    def tokens_per_image(self) -> int:
        """Rows one image hands the projector (the first token dropped if configured)."""
        return self.positions - int(self.drops_first_token)


@dataclass
class NativeViTConfig:
    """A Qwen2-VL / Qwen2.5-VL vision tower: images (and videos) at their own size, cut into a grid of
    `patch`-pixel patches (`temporal_patch` frames deep), 2D rotary positions, all images of a batch in one packed
    sequence attending image by image, then `merge` x `merge` patches merged into one LM row."""

    # "qwen2_5_vl": RMSNorm + SwiGLU (biased) blocks, window attention outside `full_attention_layers`;
    # "qwen2_vl": LayerNorm + two-linear MLP blocks, every layer full attention.
    family: str = "qwen2_5_vl"
    patch: int = 14
    temporal_patch: int = 2
    merge: int = 2
    channels: int = 3
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    mlp: int = 128
    act: str = "silu"
    rope_theta: float = 10000.0
    # Qwen2.5-VL: the attention window's side in pixels (a multiple of patch * merge), and the layers that attend
    # over the whole image instead.
    window: int = 112
    full_attention_layers: list[int] = field(default_factory=list)
    # Qwen2.5-VL's M-RoPE: a video's temporal positions advance tokens_per_second per second of frames.
    tokens_per_second: float = 4.0
    init_std: float = 0.02
    # The processor: each image resized (aspect kept, sides multiples of patch * merge) to an area within
    # [min_pixels, max_pixels], as Qwen's smart_resize does.
    min_pixels: int = 3136
    max_pixels: int = 1003520
    # The checkpoint's video placeholder id (Hugging Face import and export); mimo writes every image's and video's
    # rows at the modality's token_id. -1 = token_id + 1 on export.
    video_token_id: int = -1
    # Qwen2-VL's vision markers: the data wraps each image's (and video's) run of placeholders in
    # vision_start_token_id ... vision_end_token_id, as transformers' Qwen2-VL chat template and processor do
    # (inputs, never loss targets). Set both or neither; -1 = none, the runs stand bare (mimo's byte tokenizer has
    # no markers). Hugging Face import reads them from the checkpoint; export writes them (-1 when none).
    vision_start_token_id: int = -1
    vision_end_token_id: int = -1

    @property
    def patch_pixels(self) -> int:
        """Pixel values one patch holds: channels x temporal_patch x patch x patch."""
        return self.channels * self.temporal_patch * self.patch * self.patch

    @property
    def marked(self) -> bool:
        """Whether each item's placeholders stand between vision_start_token_id and vision_end_token_id."""
        return self.vision_start_token_id >= 0


@dataclass
class AudioConfig:
    """A Whisper-style audio encoder (conv stem, sinusoidal or learned positions, pre-LN blocks)."""

    n_mels: int = 80
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    mlp: int = 256
    max_positions: int = 1500
    act: str = "gelu"
    norm_eps: float = 1e-5
    learned_positions: bool = False
    init_std: float = 0.02


@dataclass
class ProjectorConfig:
    """Two-layer MLP from encoder width to LM width (LLaVA style)."""

    act: str = "gelu"
    bias: bool = True


@dataclass
class DecoderConfig:
    """The Out path's image decoder: per-patch pixels from the LM's states at generation tokens.

    One generated image takes (image / patch)^2 generation tokens; `hidden` is the width of the output
    projection and of the decoder's bidirectional blocks."""

    image: int = 32
    patch: int = 8
    channels: int = 3
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    mlp: int = 256
    act: str = "gelu"
    init_std: float = 0.02


@dataclass
class ModalityConfig:
    """One modality submodule: its encoder, its input projection and its placeholder token."""

    kind: str = "vision"
    token_id: int = 259
    vit: ViTConfig = field(default_factory=ViTConfig)
    # kind = "native_vision": a Qwen2-VL-style tower over images of any size and video frames (its patch merger is
    # the input projection).
    native: NativeViTConfig = field(default_factory=NativeViTConfig)
    # kind = "audio": a Whisper-style encoder over log-mel features.
    audio: AudioConfig = field(default_factory=AudioConfig)
    projector: ProjectorConfig = field(default_factory=ProjectorConfig)
    # LLaVA-NeXT's anyres tiling (kind = "vision", mimo.models.anyres): each image cut into vit.image-pixel tiles
    # at the best of these [height, width] resolutions plus an overview tile, the tiles' patch rows put back in
    # place with a learned newline row per line ([] = one tile per image, as LLaVA-1.5). anyres_max_tiles > 0 is
    # LLaVA-OneVision's anyres_max_N: larger grids shrink to about N tiles' area. The shapes demo, JSONL and
    # WebDataset (mimo.data.anyres_data) and mimo generate tile images (mimo.data.anyres_tiles); the gate refuses
    # other data sets with it.
    anyres_grid_pinpoints: list[list[int]] = field(default_factory=list)
    anyres_max_tiles: int = 0
    freeze_encoder: bool = False
    freeze_projector: bool = False
    # A Hugging Face CLIP/SigLIP (vision) directory: its config.json replaces the vit fields (drop_class_token
    # and init_std stay) and its weights load. hf_feature_layer picks the hidden state that feeds the
    # projector, as LLaVA's vision_feature_layer: -1 = last layer, -2 = penultimate (LLaVA-1.5 with CLIP).
    hf_path: str = ""
    hf_feature_layer: int = -1
    # The Out path: generation tokens with this id (-1 = none) have their LM states decoded into this
    # modality; its loss (per output token) is added to the text loss with this weight.
    output_token_id: int = -1
    output_loss_weight: float = 1.0
    decoder: DecoderConfig = field(default_factory=DecoderConfig)


@dataclass
class ModelConfig:
    llm: LLMConfig = field(default_factory=LLMConfig)
    modalities: dict[str, ModalityConfig] = field(default_factory=dict)
    freeze_llm: bool = False

    @property
    def module_names(self) -> list[str]:
        """Every module's name as layouts, dtypes and checkpointing name it: the language model's, then each
        modality's."""
        return [LANGUAGE, *self.modalities]


@dataclass
class ModuleLayoutConfig:
    """Where one module runs: a contiguous rank range and its parallel degrees (dp is derived)."""

    offset: int = 0
    size: int = 0
    tp: int = 1
    cp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    fsdp: bool = False
    # Expert parallelism (the language model's MoE layers only): ep consecutive dp ranks split the experts and
    # exchange tokens by all-to-all; must divide dp and model.llm.moe_experts. 1 = every rank holds every expert.
    ep: int = 1
    # Interleaved 1F1B (the language model's pipeline, pp >= 2): each pipeline rank holds virtual_stages model
    # chunks of layers (rank r the chunks r, r + pp, ...), and the bubble shrinks by that factor; needs
    # model.llm.layers >= pp x virtual_stages and parallel.microbatches a multiple of pp. 1 = plain 1F1B.
    virtual_stages: int = 1


@dataclass
class ParallelConfig:
    """Per-module layouts. An empty map puts every module on all ranks as pure data parallel."""

    modules: dict[str, ModuleLayoutConfig] = field(default_factory=dict)
    microbatches: int = 1
    # Seconds any collective may wait for the other ranks before the run fails with a message (instead of
    # hanging when a rank died or the ranks disagree); raise it for very long saves or evaluations.
    timeout_s: float = 1800.0


@dataclass
class DataConfig:
    name: str = "shapes"
    train_samples: int = 6000
    eval_samples: int = 300
    global_batch: int = 32
    seed: int = 1234
    # For name = "webdataset" (a .tar shard, a folder of them, or a brace list) or "jsonl" (a manifest):
    path: str = ""
    # Their held-out split for train.eval_every (another manifest, or shards): the first eval_samples of it.
    eval_path: str = ""
    # The folder a manifest's relative image paths start from ("" = the manifest's own folder), e.g. the
    # images/ folder of LLaVA-Pretrain beside its blip_laion_cc_sbu_558k.json.
    image_root: str = ""
    # Audio models on real data: every clip is padded (or cut) to audio_seconds and fills all its placeholders,
    # as Whisper pads to 30 s; 0 = the longest clip the encoder takes (2 x audio.max_positions frames).
    audio_seconds: float = 0.0
    tokenizer: str = "byte"
    # Real data's chats in training, `mimo generate` and the export: "chat" (the tokenizer's chat template, else
    # LLaVA-1.5's) or "plain" (the old bare text; a saved run without this key reads as "plain"). mimo/data/chat.py.
    prompt_format: Literal["chat", "plain"] = "chat"
    seq_len: int = 64
    workers: int = 0
    # Sequence packing: each step's samples fill rows of pack_length tokens (greedy first fit), every
    # sample attending only to itself with positions restarting; pack_length must hold the longest sample.
    packing: bool = False
    pack_length: int = 0
    # Balanced data lanes: each step's rows reordered by estimated cost (encoder work of its inputs plus the LM's)
    # so that every data lane and microbatch gets about the same work; the step's samples are unchanged, and so
    # are the loss and gradients (mimo/data/lanes.py).
    balance_lanes: bool = False
    # For name = "synthetic" (random tokens and images, for benchmarks) and "shapes": images per sample. With
    # min_images_per_sample >= 0 each sample draws its count uniformly from min_images_per_sample..images_per_sample
    # (0 = text-only samples); -1 = exactly images_per_sample. Synthetic placeholders open each seq_len-token row.
    images_per_sample: int = 1
    min_images_per_sample: int = -1
    # data.name = "synthetic" only: with N > 0, step s trains on the batch of step s mod N (a loss that can fall,
    # to check numerics on, as benchmarks/loss_check.py does); 0 draws a new batch every step.
    repeat_batches: int = 0

    @property
    def images_range(self) -> tuple[int, int]:
        """(fewest, most) images per sample of the shapes and synthetic sets."""
        low = self.images_per_sample if self.min_images_per_sample < 0 else self.min_images_per_sample
        return low, self.images_per_sample


@dataclass
class OptimConfig:
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    schedule: str = "cosine"
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0
    module_lr: dict[str, float] = field(default_factory=dict)


@dataclass
class RunConfig:
    name: str = "demo_vlm"
    out_dir: str = "runs"
    tensorboard: bool = True
    progress: bool = True
    # Mirror the logged scalars and the final summary to Weights & Biases from rank 0 (pip install wandb,
    # or pip install -e '.[wandb]' in the checkout). W&B's environment variables apply, e.g.
    # WANDB_MODE=offline; a resumed run continues its W&B run.
    wandb: bool = False
    wandb_project: str = "mimo"
    # A run folder that holds another run is refused unless train.resume continues it; overwrite = true
    # deletes its outputs (config, metrics, checkpoints, logs) and starts over, or lets a resume rewind it.
    overwrite: bool = False


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the dotted key and the fix."""
