"""One factory for the tiny configs tests build in code, and the overrides that shrink the demo TOML configs
(the demo_vlm ones, for whole runs, are in tiny_run.py).

`tiny_llm` and `tiny_vit` start from one small shape and take every difference as a keyword; `tiny_vlm`
is the one-vision-modality `Config` the parity suites (colocated, pipeline, context parallel) train, with
`PARITY_OPTIM`, whose eps well above the gradients keeps Adam's first update proportional to the
gradient (with the default 1e-8 it is lr * sign(g) and turns float noise in tiny gradients into +-lr),
and whose clip below the gradient norm exercises the global norm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mimo.config.schema import (
    Config,
    DataConfig,
    LLMConfig,
    ModalityConfig,
    ModelConfig,
    ModuleLayoutConfig,
    NativeViTConfig,
    OptimConfig,
    ParallelConfig,
    ViTConfig,
)
from mimo.data.batching import COUNTS

TINY_LLM = {"vocab": 64, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 64}
TINY_VIT = {"image": 8, "patch": 4, "hidden": 16, "layers": 1, "heads": 4, "mlp": 32}
TINY_NATIVE = {"patch": 4, "hidden": 16, "layers": 2, "heads": 2, "mlp": 32, "window": 16, "full_attention_layers": [1],
               "min_pixels": 64, "max_pixels": 1024}
PARITY_OPTIM = {"lr": 1e-2, "eps": 1e-2, "warmup_steps": 0, "schedule": "constant", "clip": 0.05}


def tiny_llm(**changes: Any) -> LLMConfig:
    """An LLMConfig of the TINY_LLM shape with `changes` (any LLMConfig field); other fields keep their defaults."""
    return LLMConfig(**{**TINY_LLM, **changes})


def tiny_vit(**changes: Any) -> ViTConfig:
    """A ViTConfig of the TINY_VIT shape with `changes` (any ViTConfig field); other fields keep their defaults."""
    return ViTConfig(**{**TINY_VIT, **changes})


def tiny_native(**changes: Any) -> NativeViTConfig:
    """A Qwen2.5-VL-style NativeViTConfig of the TINY_NATIVE shape (4-px patches, 16-px windows, layer 1 full) with
    `changes`."""
    return NativeViTConfig(**{**TINY_NATIVE, **changes})


def tiny_native_vlm(**native: Any) -> ModelConfig:
    """The TINY_LLM with M-RoPE (sections 1/1/2 of its head_dim 8) under one native_vision modality "images"
    (placeholder 60)."""
    images = ModalityConfig(kind="native_vision", token_id=60, native=tiny_native(**native))
    return ModelConfig(llm=tiny_llm(mrope_section=[1, 1, 2]), modalities={"images": images})


def tiny_vlm(llm: LLMConfig, vit: ViTConfig, token_id: int, modules: dict[str, ModuleLayoutConfig],
             microbatches: int, global_batch: int) -> Config:
    """An LM and one vision modality ("images", placeholder `token_id`) on the layout `modules`, trained
    with PARITY_OPTIM."""
    return Config(
        model=ModelConfig(llm=llm, modalities={"images": ModalityConfig(token_id=token_id, vit=vit)}),
        parallel=ParallelConfig(modules=modules, microbatches=microbatches),
        data=DataConfig(global_batch=global_batch),
        optim=OptimConfig(**PARITY_OPTIM))


# Overrides that make the AVLM and text-to-image demos train in milliseconds per step.
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
AVLM = CONFIGS / "demo_avlm.toml"
T2I = CONFIGS / "demo_text_to_image.toml"
TINY_T2I = ["--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=1",
            "--model.llm.mlp=64", "--model.modalities.images.vit.patch=16", "--model.modalities.images.vit.hidden=16",
            "--model.modalities.images.decoder.hidden=32", "--model.modalities.images.decoder.layers=1",
            "--model.modalities.images.decoder.heads=2", "--model.modalities.images.decoder.mlp=32"]
TINY_AVLM = ["--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=1",
             "--model.llm.mlp=64", "--model.modalities.images.vit.patch=16", "--model.modalities.images.vit.hidden=16",
             "--model.modalities.images.vit.layers=1", "--model.modalities.images.vit.heads=2",
             "--model.modalities.images.vit.mlp=32", "--model.modalities.audio.audio.n_mels=16",
             "--model.modalities.audio.audio.hidden=16", "--model.modalities.audio.audio.layers=1",
             "--model.modalities.audio.audio.heads=2", "--model.modalities.audio.audio.mlp=32",
             "--data.train_samples=16", "--data.eval_samples=8", "--data.global_batch=8", "--optim.warmup_steps=1",
             "--metrics.progress=false", "--metrics.tensorboard=false", "--train.threads=1"]


def image_text_batch(counts: torch.Tensor, seq: int, token_id: int, g: torch.Generator) -> dict:
    """A global batch for `tiny_vlm` (a TINY_VIT of 8 x 8 images, 4 rows each): sample s holds counts[s] images
    (their placeholders right after the first token), random text ids and labels on a text tail whose length
    varies with s, and `COUNTS`; everything drawn from `g`."""
    n = counts.shape[0]
    ids = torch.randint(1, 50, (n, seq), generator=g)
    labels = torch.full((n, seq), -100)
    for s in range(n):
        k = int(counts[s]) * 4
        ids[s, 1: 1 + k] = token_id
        text = list(range(1 + k, seq - s % 3))
        labels[s, text] = torch.randint(1, 50, (len(text),), generator=g)
    pixels = torch.randn(int(counts.sum()), 3, 8, 8, generator=g)
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(seq).expand(n, seq).contiguous(),
            "modality_inputs": {"images": {"vit": {"pixel_values": pixels}}}, COUNTS: {"images": counts}}
