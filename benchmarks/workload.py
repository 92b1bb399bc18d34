"""The workloads of presets.json built from mimo's own modules, with the same data as the baseline.

The baseline file (baseline/hf_vlm_baseline.py, a byte-identical copy of shared/bench/) is imported as a
module: its preset loader and its FLOPs formula are used as they are, so both sides count the same work.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from mimo.config.schema import LLMConfig, ModalityConfig, ModelConfig, ProjectorConfig, ViTConfig
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import token_indices

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


@dataclass
class Batch:
    """One micro-batch. `labels[:, i]` is the token position i predicts (IGNORE_INDEX where there is none);
    `token_indices` and `loss_rows` are flat positions computed once here, so a step never has to find them
    (which would make the host wait for the device)."""

    pixels: torch.Tensor
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    token_indices: dict[str, torch.Tensor]
    loss_rows: torch.Tensor

    def modality_inputs(self) -> dict:
        return {MODALITY: {"vit": {"pixel_values": self.pixels}}}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the batch by name, following the dataclass fields (a field added later is copied
        into a captured step's buffers too); a dict field gives one entry per key."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out.update({f"{f.name}[{k}]": t for k, t in value.items()} if isinstance(value, dict) else {f.name: value})
        return out

    def clone(self) -> Batch:
        def copy(value):
            return {k: t.clone() for k, t in value.items()} if isinstance(value, dict) else value.clone()
        return Batch(**{f.name: copy(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def copy_(self, other: Batch) -> None:
        """Take `other`'s values into these tensors (a captured step's inputs); shapes must match."""
        mine, theirs = self.tensors(), other.tensors()
        if mine.keys() != theirs.keys():
            raise ValueError(f"batch holds {sorted(theirs)}, the captured step was recorded with {sorted(mine)}")
        for name, t in mine.items():
            if t.shape != theirs[name].shape:
                raise ValueError(f"batch.{name} has shape {tuple(theirs[name].shape)}, but the captured step was "
                                 f"recorded with {tuple(t.shape)}: a CUDA graph replays fixed shapes (step_graph=0 "
                                 f"takes any)")
        for name, t in mine.items():
            t.copy_(theirs[name])


def make_batches(p: dict, device: torch.device, count: int = 2, seed: int = 1) -> list[Batch]:
    """The baseline's draws (same generator, seed and order): random pixels, random text ids, and the
    image placeholders at the start of every sequence. The loss covers the text positions only."""
    gen = torch.Generator().manual_seed(seed)
    b, s, n = p["micro_batch"], p["seq_len"], image_tokens(p)
    size, vocab = p["vision"]["image"], p["llm"]["vocab"]
    batches = []
    for _ in range(count):
        pixels = torch.randn(b, 3, size, size, generator=gen)
        ids = torch.randint(0, vocab - 2, (b, s), generator=gen)
        ids[:, :n] = image_token_id(p)
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[:, n - 1:-1] = ids[:, n:]
        indices = token_indices(ids, {MODALITY: image_token_id(p)})
        batches.append(Batch(
            pixels=pixels.to(device), input_ids=ids.to(device), labels=labels.to(device),
            position_ids=torch.arange(s).expand(b, s).to(device),
            token_indices={k: v.to(device) for k, v in indices.items()},
            loss_rows=(labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1).to(device)))
    return batches
