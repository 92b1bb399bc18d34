"""Parameter-name maps between mimo's modules and Hugging Face checkpoints, family by family.

Maps are built from the module's own state-dict names, so they follow whatever the module holds: a
pipeline stage with layers 4..7, an untied head or not, optional biases and norms, tensor-parallel shards
(which keep their names). Each function returns {mimo name: HF name without the checkpoint's prefix}; where
the checkpoint fuses several of mimo's tensors into one (Phi-3's qkv_proj and gate_up_proj) the HF name is a
`Rows` part: (name, first row, end row) of the fused tensor; where it splits one of mimo's tensors into several
(a mixture of experts' stacked `w_gate` `[E, ...]`, one tensor per expert in the checkpoint) it is an
`ExpertStack` of the per-expert names, expert 0 first.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from mimo.config.schema import ViTConfig
from mimo.models.audio import AudioEncoder
from mimo.models.llm import DecoderLM
from mimo.models.vit import VisionTransformer

Rows = tuple[str, int, int]


@dataclass(frozen=True)
class ExpertStack:
    """mimo's `[E, ...]` tensor is these E checkpoint tensors stacked along dim 0."""

    names: tuple[str, ...]


HFName = str | Rows | ExpertStack
# Where each MoE family keeps a layer's router, experts (gate, up, down) and shared expert, after "layers.<i>.".
MOE_NAMES = {"mixtral": ("block_sparse_moe.gate", "block_sparse_moe.experts.{}.", ("w1", "w3", "w2")),
             "qwen": ("mlp.gate", "mlp.experts.{}.", ("gate_proj", "up_proj", "down_proj"))}


def _names(module: nn.Module) -> list[str]:
    return list(module.state_dict(keep_vars=True))


def llm_names(lm: DecoderLM, body: str = "model.", head: str = "") -> dict[str, HFName]:
    """Qwen2/Qwen3/Llama/Mistral: identical names under `body` ("model."); the untied head is `head` +
    lm_head.weight. Phi-3 fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (full-model rows, so a
    tensor-parallel shard function slices within each part)."""
    names: dict[str, HFName] = {n: (head + n if n == "lm_head.weight" else body + n) for n in _names(lm)}
    if lm.cfg.moe_experts:
        names.update(moe_names(lm, body))
    if lm.cfg.family == "phi3":
        q, kv, mlp = lm.cfg.heads * lm.head_dim, lm.cfg.kv_heads * lm.head_dim, lm.cfg.mlp
        parts = {"self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
                 "self_attn.k_proj": ("self_attn.qkv_proj", q, q + kv),
                 "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, q + 2 * kv),
                 "mlp.gate_proj": ("mlp.gate_up_proj", 0, mlp), "mlp.up_proj": ("mlp.gate_up_proj", mlp, 2 * mlp)}
        for n in list(names):
            layer, _, rest = n.partition(".")[2].partition(".")
            module, _, leaf = rest.rpartition(".")
            if n.startswith("layers.") and module in parts:
                fused, start, end = parts[module]
                names[n] = (f"{body}layers.{layer}.{fused}.{leaf}", start, end)
    return names


def moe_names(lm: DecoderLM, body: str) -> dict[str, HFName]:
    """The MoE layers' tensors: router, each of w_gate / w_up / w_down as the stack of its experts' tensors
    (all E experts, whatever part of them this rank holds), Qwen2-MoE's shared expert and its gate."""
    mixtral = not (lm.cfg.qk_norm or lm.cfg.qkv_bias)  # Qwen3-MoE has qk_norm, Qwen2-MoE qkv_bias (as export)
    router, expert, (gate, up, down) = MOE_NAMES["mixtral" if mixtral else "qwen"]
    out: dict[str, HFName] = {}
    for key, layer in lm.layers.items():
        moe = layer.mlp
        if not hasattr(moe, "router"):
            continue
        at = f"layers.{key}.mlp."
        experts = range(moe.num_experts)  # the whole stack: a rank's view picks its experts (and FSDP shard)
        out[at + "router.weight"] = f"{body}layers.{key}.{router}.weight"
        for ours, theirs in (("w_gate", gate), ("w_up", up), ("w_down", down)):
            out[at + ours] = ExpertStack(tuple(f"{body}layers.{key}.{expert.format(e)}{theirs}.weight"
                                               for e in experts))
        for part in ("gate_proj", "up_proj", "down_proj") if moe.shared is not None else ():
            out[at + f"shared.{part}.weight"] = f"{body}layers.{key}.mlp.shared_expert.{part}.weight"
        if moe.shared_gate is not None:
            out[at + "shared_gate.weight"] = f"{body}layers.{key}.mlp.shared_expert_gate.weight"
    return out


_VIT_EMBEDDINGS = ("class_embedding", "patch_embedding.", "position_embedding.")
_DINOV2 = {"class_embedding": "embeddings.cls_token", "position_embedding.weight": "embeddings.position_embeddings",
           "patch_embedding.": "embeddings.patch_embeddings.projection.", "post_layernorm.": "layernorm.",
           ".layer_norm1.": ".norm1.", ".layer_norm2.": ".norm2.", ".self_attn.q_proj.": ".attention.attention.query.",
           ".self_attn.k_proj.": ".attention.attention.key.", ".self_attn.v_proj.": ".attention.attention.value.",
           ".self_attn.o_proj.": ".attention.output.dense."}


def vit_anchor(cfg: ViTConfig) -> str:
    """A tensor every checkpoint of the tower's family has, to find where it keeps the tower."""
    return "embeddings.patch_embeddings.projection.weight" if cfg.layer_scale else "embeddings.patch_embedding.weight"


def vit_names(vit: VisionTransformer) -> dict[str, HFName]:
    """CLIP/SigLIP vision towers: embeddings.* and encoder.layers.*; attention output is `out_proj`. DINOv2
    (a tower with layer scale): embeddings.cls_token / position_embeddings / patch_embeddings.projection,
    encoder.layer.*.{norm1, attention.attention.query/key/value, attention.output.dense, layer_scale1.lambda1},
    final `layernorm` (its cls token and positions carry leading singleton dims, which loading drops)."""
    out: dict[str, HFName] = {}
    for n in _names(vit):
        if vit.cfg.layer_scale:
            hf = n
            for ours, theirs in _DINOV2.items():
                if ours.startswith("."):
                    hf = hf.replace(ours, theirs)
                elif hf.startswith(ours):
                    hf = theirs + hf[len(ours):]
            if hf.startswith("layers."):
                hf = "encoder.layer." + hf[len("layers."):]
            out[n] = hf + ".lambda1" if hf.endswith(("layer_scale1", "layer_scale2")) else hf
        elif n.startswith(_VIT_EMBEDDINGS):
            out[n] = "embeddings." + n
        elif n.startswith("layers."):
            out[n] = "encoder." + n.replace(".self_attn.o_proj.", ".self_attn.out_proj.")
        else:
            out[n] = n
    return out


def audio_names(enc: AudioEncoder) -> dict[str, str]:
    """Whisper encoder: same names, except `out_proj` and fc1/fc2 directly on the layer."""
    return {n: n.replace(".self_attn.o_proj.", ".self_attn.out_proj.").replace(".mlp.fc", ".fc")
            for n in _names(enc)}


def projector_names(projector: nn.Module) -> dict[str, str]:
    """LLaVA's multi_modal_projector: linear_1, act, linear_2."""
    return {n: n.replace("fc1.", "linear_1.").replace("fc2.", "linear_2.") for n in _names(projector)}


def with_prefix(names: dict[str, HFName], prefix: str) -> dict[str, HFName]:
    def prefixed(v: HFName) -> HFName:
        if isinstance(v, ExpertStack):
            return ExpertStack(tuple(prefix + n for n in v.names))
        return prefix + v if isinstance(v, str) else (prefix + v[0], *v[1:])

    return {k: prefixed(v) for k, v in names.items()}
