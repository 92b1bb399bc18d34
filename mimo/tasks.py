"""The task registry: a data set's name (data.name) -> how to build it from the config and how to evaluate a
model on its held-out part. The trainer and `mimo eval` both read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mimo.config.schema import Config
from mimo.data.anyres_data import build_anyres_data
from mimo.data.audio_demo import build_avlm_data
from mimo.data.demo import DemoVLMData
from mimo.data.image_text import IMAGE_TEXT_SETS, build_image_text_data
from mimo.data.native_data import build_native_data
from mimo.data.shapes import IMAGE_SIZE
from mimo.data.synthetic import build_synthetic_data, evaluate_synthetic
from mimo.data.text_to_image import build_text_to_image_data
from mimo.eval.answers import evaluate_answers
from mimo.eval.avlm import evaluate_avlm
from mimo.eval.text_to_image import evaluate_text_to_image
from mimo.models.anyres import AnyResSubmodules
from mimo.models.multimodal import MimoModel

# Demo sets beyond "shapes", by data.name: (build from the config, held-out evaluation of a model).
DEMO_SETS: dict[str, tuple[Callable[[Config, MimoModel], Any], Callable[[MimoModel, Any], dict]]] = {
    "avlm": (build_avlm_data, evaluate_avlm),
    "text_to_image": (build_text_to_image_data, evaluate_text_to_image),
    "synthetic": (build_synthetic_data, evaluate_synthetic),
}


def build_demo_data(cfg: Config, model: MimoModel) -> Any:
    if cfg.data.name in DEMO_SETS:
        return DEMO_SETS[cfg.data.name][0](cfg, model)
    if cfg.data.name in IMAGE_TEXT_SETS:
        kinds = {m.kind for m in cfg.model.modalities.values()}
        tiled = any(m.anyres_grid_pinpoints for m in cfg.model.modalities.values())
        build = build_native_data if "native_vision" in kinds else build_anyres_data if tiled else build_image_text_data
        return build(cfg, model)
    if cfg.data.name != "shapes":
        raise ValueError(f"data.name = '{cfg.data.name}' is not a known data set; use one of "
                         f"{', '.join(['shapes', *DEMO_SETS, *IMAGE_TEXT_SETS])}")
    if len(cfg.model.modalities) != 1:
        raise ValueError("the shapes demo needs exactly one vision modality under model.modalities")
    (name, mcfg), = cfg.model.modalities.items()
    sub = model.modality_submodules[name]
    vit = sub.encoders["vit"]
    if isinstance(sub, AnyResSubmodules):
        return DemoVLMData(cfg.data.train_samples, cfg.data.eval_samples, cfg.data.seed,
                           sub.rows_of((IMAGE_SIZE, IMAGE_SIZE)), mcfg.token_id, modality=name,
                           images=cfg.data.images_range, grid_pinpoints=sub.grid_pinpoints, tile=vit.cfg.image)
    return DemoVLMData(cfg.data.train_samples, cfg.data.eval_samples, cfg.data.seed, vit.tokens_per_image,
                       mcfg.token_id, modality=name, images=cfg.data.images_range)



def evaluate_demo(cfg: Config, model: MimoModel, data: Any, device: str | torch.device) -> dict:
    """Held-out evaluation of the demo set that data.name names."""
    if cfg.data.name in DEMO_SETS:
        return DEMO_SETS[cfg.data.name][1](model, data)
    if cfg.data.name in IMAGE_TEXT_SETS:
        return data.evaluate(model, device)
    return evaluate_answers(model, data, device=device)
