"""The workloads of presets.json as mimo model configs (benchmarks/presets/*.toml ship them as `mimo train`
configs; tests/unit/test_benchmark.py holds the two equal).

The baseline file (baseline/hf_vlm_baseline.py, a byte-identical copy of shared/bench/) is imported as a
module: its preset loader and its FLOPs formula are used as they are, so both sides count the same work.
"""

from __future__ import annotations

import functools
import importlib.util
import types
from pathlib import Path

from mimo.config.schema import LLMConfig, ModalityConfig, ModelConfig, ProjectorConfig, ViTConfig

BASELINE_DIR = Path(__file__).resolve().parent / "baseline"
BASELINE_SCRIPT = BASELINE_DIR / "hf_vlm_baseline.py"
MODALITY = "images"


@functools.cache
def baseline_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("hf_vlm_baseline", BASELINE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_preset(name: str) -> dict:
    return baseline_module().load_preset(name)


def train_flops_per_sample(p: dict) -> int:
    return baseline_module().train_flops_per_sample(p)


def image_tokens(p: dict) -> int:
    return baseline_module().image_tokens(p)


def images_seq_len(p: dict, images: int) -> int:
    """Sequence length of a sample with `images` images: their placeholders, then the preset's text
    (p["seq_len"] - image_tokens(p) tokens, the length of the text next to the preset's one image)."""
    return images * image_tokens(p) + p["seq_len"] - image_tokens(p)


def image_token_id(p: dict) -> int:
    """The placeholder id the baseline uses: the last vocabulary entry (text ids stay below vocab - 2)."""
    return p["llm"]["vocab"] - 1


def model_config(p: dict) -> ModelConfig:
    """A preset as a mimo model: CLIP-style ViT (GELU, class token dropped), GELU MLP projector, and a
    Qwen2-style LM with qkv bias and an untied head."""
    v, lm = p["vision"], p["llm"]
    vit = ViTConfig(image=v["image"], patch=v["patch"], hidden=v["hidden"], layers=v["layers"], heads=v["heads"],
                    mlp=v["mlp"], act="gelu", drop_class_token=True)
    llm = LLMConfig(vocab=lm["vocab"], hidden=lm["hidden"], layers=lm["layers"], heads=lm["heads"],
                    kv_heads=lm["kv_heads"], mlp=lm["mlp"], qkv_bias=True, tie_embeddings=False,
                    max_seq=max(4096, p["seq_len"]))
    modality = ModalityConfig(token_id=image_token_id(p), vit=vit, projector=ProjectorConfig(act="gelu", bias=True))
    return ModelConfig(llm=llm, modalities={MODALITY: modality})
