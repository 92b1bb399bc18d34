"""A saved tiny any-resolution LLaVA run, its images and their processed pixels, for export and generate tests."""

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mimo.config.load import dump_toml
from mimo.config.schema import Config, ModalityConfig, ModelConfig, ViTConfig
from mimo.data.tokenizer import ByteTokenizer
from mimo.hf.build import build_model
from mimo.train.checkpoint.weights import save_weights
from tests.support.configs import tiny_llm
from tests.support.hf_helpers import perturb, transformers

PINPOINTS = [[16, 32], [32, 16], [32, 32], [16, 48]]
PROMPTS = ["what color?", "a", "how many shapes are there?"]
SIZES = [(20, 40), (40, 24), (12, 44)]  # (height, width)
STEPS = 8
TOWERS = {"clip": {}, "siglip": dict(class_token=False, pre_norm=False, patch_bias=True, act="gelu_tanh")}
# anyres_max_1 shrinks every grid of more than one tile (OneVision's interpolation).
CASES = {"next_clip": ("clip", 0, "LlavaNextForConditionalGeneration"),
         "next_siglip": ("siglip", 0, "LlavaNextForConditionalGeneration"),
         "onevision_siglip": ("siglip", 9, "LlavaOnevisionForConditionalGeneration"),
         "onevision_clip": ("clip", 9, "LlavaOnevisionForConditionalGeneration"),
         "onevision_shrunk": ("siglip", 1, "LlavaOnevisionForConditionalGeneration")}


def anyres_config(tower: str, max_tiles: int) -> ModelConfig:
    vit = ViTConfig(image=16, patch=4, hidden=16, heads=2, mlp=32, **TOWERS[tower])
    images = ModalityConfig(token_id=ByteTokenizer.IMAGE, vit=vit, anyres_grid_pinpoints=PINPOINTS,
                            anyres_max_tiles=max_tiles)
    return ModelConfig(llm=tiny_llm(vocab=ByteTokenizer.vocab_size, init_std=0.2), modalities={"images": images})


def images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in SIZES]


def processed(out, max_tiles: int):
    """The exported processor's batch: `AutoProcessor` for LLaVA-NeXT. LlavaOnevisionProcessor needs torchvision,
    which this environment lacks, so for OneVision its image processor, its token count (the class's own
    `replace_image_token`, given the saved processor_config.json) and the tokenizer make the batch."""
    texts = ["<image>" + p for p in PROMPTS]
    if not max_tiles:
        return transformers.AutoProcessor.from_pretrained(out)(text=texts, images=images(), padding=True,
                                                                return_tensors="pt")
    saved = json.loads((out / "processor_config.json").read_text())
    assert saved["processor_class"] == "LlavaOnevisionProcessor"
    pixels = transformers.AutoImageProcessor.from_pretrained(out)(images(), return_tensors="pt")
    counter = object.__new__(transformers.LlavaOnevisionProcessor)
    counter.image_processor = transformers.LlavaOnevisionImageProcessorPil(**saved["image_processor"])
    for key in ("num_image_tokens", "vision_aspect_ratio", "vision_feature_select_strategy", "image_token"):
        setattr(counter, key, saved[key])
    texts = [t.replace("<image>", counter.replace_image_token(pixels, i)) for i, t in enumerate(texts)]
    tokens = transformers.AutoTokenizer.from_pretrained(out)(texts, padding=True, return_tensors="pt")
    return transformers.BatchFeature({**tokens, **pixels})


def saved_anyres_run(tmp_path, tower: str, max_tiles: int) -> Path:
    """tmp_path / "run": a random anyres run (anyres_config, seed 0, weights perturbed) saved as training would."""
    cfg = anyres_config(tower, max_tiles)
    torch.manual_seed(0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(Config(model=cfg)))
    save_weights(perturb(build_model(cfg), scale=0.3), run)
    return run
