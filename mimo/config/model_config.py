"""The `model` section of the config: the language model, each modality's encoder, projector and decoder.

Part of the typed config tree (mimo.config.schema holds the whole `Config`). Every field carries its one-line
doc (`mimo.config.fields.doc`), from which docs/configuration.md is generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mimo.config.fields import doc

LANGUAGE = "language"
"""The language model's name among the modules (layouts, dtypes, checkpointing)."""

LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
"""The keys of model.llm.rope_scaling (Llama 3's long-context RoPE), as in Hugging Face's rope_scaling."""


@dataclass
class LLMConfig:
    """A Llama/Qwen2-style decoder."""

    vocab: int = doc(320, "Vocabulary size (rows of the embedding and the output head).")
    hidden: int = doc(128, "Width of the residual stream.")
    layers: int = doc(4, "Decoder layers.")
    heads: int = doc(4, "Attention (query) heads.")
    kv_heads: int = doc(2, "Key/value heads (grouped-query attention); divides heads.")
    mlp: int = doc(384, "Width of the SwiGLU MLP.")
    qkv_bias: bool = doc(True, "Biases on the q, k and v projections (Qwen2).")
    tie_embeddings: bool = doc(False, "The output head shares the input embedding's weights.")
    rope_theta: float = doc(10000.0, "RoPE base frequency.")
    norm_eps: float = doc(1e-6, "RMSNorm epsilon.")
    max_seq: int = doc(4096, "Longest sequence the rotary tables cover.")
    init_std: float = doc(0.02, "Standard deviation of the random initialisation.")
    qk_norm: bool = doc(False, "RMSNorm on each head's queries and keys (Qwen3, OLMo 2).")
    qk_norm_full: bool = doc(False, "OLMo 2: the q/k norms span all heads at once (weights [heads * head_dim]).")
    post_norm: bool = doc(False, "OLMo 2: each block normalises its attention and MLP outputs, not their inputs.")
    sandwich_norm: bool = doc(False, "Gemma 3: norms before and after both attention and MLP.")
    norm_offset: bool = doc(False, "Gemma: RMSNorm scales by (1 + weight).")
    embed_scale: bool = doc(False, "Gemma: embeddings times sqrt(hidden).")
    mlp_act: str = doc("silu", "The MLP gate's activation (Gemma: gelu_tanh).")
    query_scale: float = doc(0.0, "Attention scores times this (0 = 1 / sqrt(head_dim)).")
    sliding_window: int = doc(0, "Positions a \"sliding\" layer attends back over (Gemma); 0 = none.")
    layer_types: list[Literal["sliding", "full"]] = doc([], "Each layer's attention, \"sliding\" or \"full\" "
                                                            "([] = all full).")
    rope_local_theta: float = doc(0.0, "RoPE base of the sliding layers (0 = rope_theta).")
    attn_softcap: float = doc(0.0, "Gemma 2: attention scores soft-capped, cap * tanh(x / cap) (0 = none).")
    logit_softcap: float = doc(0.0, "Gemma 2: output logits soft-capped the same way (0 = none).")
    head_dim: int = doc(0, "Width of one attention head (0 = hidden // heads; Qwen3 sets it).")
    rope_scaling: dict[str, float] = doc({}, "Llama 3 RoPE scaling, keys as in HF's rope_scaling (factor, "
                                             "low_freq_factor, high_freq_factor, original_max_position_embeddings); "
                                             "{} = plain RoPE.")
    mrope_section: list[int] = doc([], "Qwen2-VL M-RoPE: the rotary frequencies' (temporal, height, width) "
                                       "sections, summing to head_dim / 2; [] = one-axis RoPE.")
    family: str = doc("", "The Hugging Face family an export writes (qwen2, qwen3, llama, mistral, phi3, olmo2); "
                          "\"\" = the one the fields imply.")
    hf_path: str = doc("", "A Hugging Face Qwen2/Qwen3/Llama/Mistral directory: its config.json replaces the "
                           "fields above and its weights load.")
    extra_tokens: list[str] = doc([], "Tokens added to hf_path's vocabulary and the run's tokenizer at ids "
                                      "vocab_size + i, e.g. [\"<image>\"].")
    moe_experts: int = doc(0, "Routed experts of the mixture-of-experts layers (0 = dense).")
    moe_top_k: int = doc(2, "Experts each token goes to.")
    moe_mlp: int = doc(0, "Width of each expert.")
    moe_every: int = doc(1, "Every n-th layer is MoE (layer i when (i + 1) % moe_every == 0).")
    moe_dense_layers: list[int] = doc([], "Layers kept dense whatever moe_every says.")
    moe_shared_mlp: int = doc(0, "Width of a shared expert every token passes (0 = none).")
    moe_shared_gate: bool = doc(False, "Qwen2-MoE's sigmoid gate on the shared expert.")
    moe_gating: Literal["softmax", "sigmoid"] = doc("softmax", "Router: top-k of a softmax, or of sigmoid scores "
                                                               "plus a balancing bias.")
    moe_norm_topk: bool = doc(False, "Softmax gating: renormalise the k weights to sum 1.")
    moe_bias_rate: float = doc(0.0, "Sigmoid gating: how fast the balancing bias moves toward even loads.")
    moe_aux_loss_weight: float = doc(0.0, "Weight of the router's load-balancing loss in the objective.")
    moe_z_loss_weight: float = doc(0.0, "Weight of the router's z-loss in the objective.")

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

    image: int = doc(32, "Side of the (square) input image in pixels.")
    patch: int = doc(8, "Side of a patch in pixels.")
    channels: int = doc(3, "Image channels.")
    hidden: int = doc(64, "Width of the tower.")
    layers: int = doc(2, "Transformer blocks.")
    heads: int = doc(4, "Attention heads.")
    mlp: int = doc(256, "Width of the MLP.")
    act: str = doc("gelu", "The MLP's activation.")
    norm_eps: float = doc(1e-5, "LayerNorm epsilon.")
    drop_class_token: bool = doc(True, "Drop the class token's output before the projector.")
    init_std: float = doc(0.02, "Standard deviation of the random initialisation.")
    class_token: bool = doc(True, "A class token (false for SigLIP-style towers).")
    pre_norm: bool = doc(True, "A LayerNorm before the blocks (false for SigLIP).")
    patch_bias: bool = doc(False, "A bias on the patch embedding (SigLIP).")
    post_norm: bool = doc(False, "A LayerNorm after the blocks (SigLIP).")
    drop_first_patch: bool = doc(False, "Without a class token, drop the first patch's output, as LLaVA's "
                                        "\"default\" feature strategy does on SigLIP.")
    layer_scale: bool = doc(False, "DINOv2: a learned per-channel scale on each block's attention and MLP outputs.")
    patch_linear: bool = doc(False, "SigLIP2: the patch embedding is a linear over each patch's flattened pixels.")

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

    family: Literal["qwen2_5_vl", "qwen2_vl"] = doc(
        "qwen2_5_vl", "qwen2_5_vl: RMSNorm + SwiGLU blocks, window attention outside full_attention_layers; "
                      "qwen2_vl: LayerNorm + MLP blocks, all full attention.")
    patch: int = doc(14, "Side of a patch in pixels.")
    temporal_patch: int = doc(2, "Frames one patch spans.")
    merge: int = doc(2, "merge x merge patches become one LM row.")
    channels: int = doc(3, "Image channels.")
    hidden: int = doc(64, "Width of the tower.")
    layers: int = doc(2, "Transformer blocks.")
    heads: int = doc(4, "Attention heads.")
    mlp: int = doc(128, "Width of the MLP.")
    act: Literal["silu", "gelu", "gelu_tanh", "quick_gelu", "relu"] = doc("silu", "The MLP's activation.")
    rope_theta: float = doc(10000.0, "Base frequency of the 2D rotary positions.")
    window: int = doc(112, "Qwen2.5-VL: the attention window's side in pixels, a multiple of patch * merge.")
    full_attention_layers: list[int] = doc([], "Qwen2.5-VL: the layers that attend over the whole image.")
    tokens_per_second: float = doc(4.0, "M-RoPE: a video's temporal positions advance this much per second.")
    init_std: float = doc(0.02, "Standard deviation of the random initialisation.")
    min_pixels: int = doc(3136, "Smallest area an image is resized to (aspect kept, as Qwen's smart_resize).")
    max_pixels: int = doc(1003520, "Largest area an image is resized to.")
    video_token_id: int = doc(-1, "The checkpoint's video placeholder id (HF import/export); -1 = token_id + 1 "
                                  "on export.")
    vision_start_token_id: int = doc(-1, "Marker before each item's placeholders, as Qwen2-VL's template writes "
                                         "it (-1 = none; set both markers or neither).")
    vision_end_token_id: int = doc(-1, "Marker after each item's placeholders (-1 = none).")

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

    n_mels: int = doc(80, "Mel bins of the log-mel features.")
    hidden: int = doc(64, "Width of the encoder.")
    layers: int = doc(2, "Transformer blocks.")
    heads: int = doc(4, "Attention heads.")
    mlp: int = doc(256, "Width of the MLP.")
    max_positions: int = doc(1500, "Positions after the conv stem (Whisper: 1500 = 30 s).")
    act: str = doc("gelu", "The MLP's activation.")
    norm_eps: float = doc(1e-5, "LayerNorm epsilon.")
    learned_positions: bool = doc(False, "Learned positions instead of sinusoidal ones.")
    init_std: float = doc(0.02, "Standard deviation of the random initialisation.")


@dataclass
class ProjectorConfig:
    """Two-layer MLP from encoder width to LM width (LLaVA style)."""

    act: str = doc("gelu", "The activation between the two layers.")
    bias: bool = doc(True, "Biases on both layers.")


@dataclass
class DecoderConfig:
    """The Out path's image decoder: per-patch pixels from the LM's states at generation tokens.

    One generated image takes (image / patch)^2 generation tokens; `hidden` is the width of the output
    projection and of the decoder's bidirectional blocks."""

    image: int = doc(32, "Side of the generated image in pixels.")
    patch: int = doc(8, "Side of the patch one generation token draws.")
    channels: int = doc(3, "Channels of the generated image.")
    hidden: int = doc(128, "Width of the output projection and the decoder's blocks.")
    layers: int = doc(2, "Bidirectional transformer blocks.")
    heads: int = doc(4, "Attention heads.")
    mlp: int = doc(256, "Width of the MLP.")
    act: str = doc("gelu", "The MLP's activation.")
    init_std: float = doc(0.02, "Standard deviation of the random initialisation.")


@dataclass
class ModalityConfig:
    """One modality submodule: its encoder, its input projection and its placeholder token."""

    kind: Literal["vision", "native_vision", "audio"] = doc(
        "vision", "vision (a ViT over fixed-size images), native_vision (Qwen2-VL's tower, images of any size and "
                  "video) or audio (Whisper-style).")
    token_id: int = doc(259, "The placeholder id its rows take in the LM's input.")
    vit: ViTConfig = field(default_factory=ViTConfig)
    native: NativeViTConfig = field(default_factory=NativeViTConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    projector: ProjectorConfig = field(default_factory=ProjectorConfig)
    anyres_grid_pinpoints: list[list[int]] = doc([], "LLaVA-NeXT anyres: [height, width] resolutions an image is "
                                                     "tiled at, plus an overview tile ([] = one tile).")
    anyres_max_tiles: int = doc(0, "LLaVA-OneVision's anyres_max_N: larger grids shrink to about N tiles (0 = off).")
    freeze_encoder: bool = doc(False, "Train nothing of the encoder.")
    freeze_projector: bool = doc(False, "Train nothing of the projector.")
    hf_path: str = doc("", "A Hugging Face CLIP/SigLIP directory: its config.json replaces the vit fields and its "
                           "weights load.")
    hf_feature_layer: int = doc(-1, "The hidden state that feeds the projector, as LLaVA's vision_feature_layer "
                                    "(-1 = last, -2 = penultimate).")
    output_token_id: int = doc(-1, "The Out path: generation tokens with this id are decoded into this modality "
                                   "(-1 = none).")
    output_loss_weight: float = doc(1.0, "Weight of the Out path's loss beside the text loss.")
    decoder: DecoderConfig = field(default_factory=DecoderConfig)


@dataclass
class ModelConfig:
    """The language model and its modalities."""

    llm: LLMConfig = field(default_factory=LLMConfig)
    modalities: dict[str, ModalityConfig] = doc({}, "The modalities by name ([model.modalities.<name>]).")
    freeze_llm: bool = doc(False, "Train nothing of the language model.")

    @property
    def module_names(self) -> list[str]:
        """Every module's name as layouts, dtypes and checkpointing name it: the language model's, then each
        modality's."""
        return [LANGUAGE, *self.modalities]
