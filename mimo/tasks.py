"""The data-set registry: one `DataSet` entry per data.name, everything the rest of mimo knows of a data set.
The gate (mimo.train.gate) reads its checks, row length and tokenizer; the trainer and `mimo eval` build the
set and evaluate a model on its held-out part through it. The pure facts (row lengths, checks, tokenizers) live
in mimo.data.set_facts, the builders in data/, the evaluations in eval/; this room, above both, joins them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from mimo.config.schema import Config, ConfigError, ModelConfig
from mimo.data import set_facts as facts
from mimo.data.anyres_data import build_anyres_data
from mimo.data.audio_demo import build_avlm_data
from mimo.data.demo import build_shapes_data
from mimo.data.image_text import RecordReader, build_image_text_data
from mimo.data.jsonl import read_manifest
from mimo.data.media import clip_samples
from mimo.data.native_data import build_native_data
from mimo.data.synthetic import build_synthetic_data, evaluate_synthetic
from mimo.data.text_to_image import build_text_to_image_data
from mimo.data.webdataset import read_webdataset
from mimo.eval.answers import evaluate_answers
from mimo.eval.avlm import evaluate_avlm
from mimo.eval.text_to_image import evaluate_text_to_image
from mimo.models.multimodal import MimoModel

Device = str | torch.device


@dataclass(frozen=True)
class DataSet:
    """One data set. `build(cfg, model)`: the data object the trainer draws global batches from (`model` is the
    built, possibly laid-out model). `evaluate(model, data, device)`: held-out metrics of a whole model, in one
    process, no collective. `row_length(cfg, model_cfg)`: tokens of every row the LM sees, None when the model
    lacks what the set needs. `check(cfg, model_cfg)`: raises a ConfigError when the model cannot train on the
    set. `tokenizer(cfg)`: the spec its text is written with ("byte" or a folder), None for synthetic ids.
    For the planner: `inputs_per_sample(cfg, kind)`, the average images or clips of a modality kind in a sample;
    `clip_samples(cfg, max_positions)`, the audio samples of one clip for an encoder of `max_positions`."""

    build: Callable[[Config, MimoModel], Any]
    evaluate: Callable[[MimoModel, Any, Device], dict]
    row_length: Callable[[Config, ModelConfig], int | None]
    check: Callable[[Config, ModelConfig], None]
    tokenizer: Callable[[Config], str | None]
    inputs_per_sample: Callable[[Config, str], float] = facts.mean_inputs_per_sample
    clip_samples: Callable[[Config, int], int] = clip_samples


def real_data(reader: Callable[[Config], RecordReader]) -> DataSet:
    """jsonl or webdataset, its records read by `reader(cfg)`: native-resolution, anyres-tiled or fixed-size
    inputs, as the model's modalities ask."""

    def build(cfg: Config, model: MimoModel) -> Any:
        modalities = cfg.model.modalities.values()
        if any(m.kind == "native_vision" for m in modalities):
            return build_native_data(cfg, model, reader(cfg))
        if any(m.anyres_grid_pinpoints for m in modalities):
            return build_anyres_data(cfg, model, reader(cfg))
        return build_image_text_data(cfg, model, reader(cfg))

    return DataSet(build, lambda model, data, device: data.evaluate(model, device), facts.seq_len_rows,
                   facts.check_real_data, facts.config_tokenizer)


DATA_SETS: dict[str, DataSet] = {
    "shapes": DataSet(build_shapes_data, lambda model, data, device: evaluate_answers(model, data, device=device),
                      facts.shapes_row_length, facts.check_shapes, facts.byte_tokenizer),
    "avlm": DataSet(build_avlm_data, lambda model, data, device: evaluate_avlm(model, data), facts.avlm_rows,
                    facts.check_avlm, facts.byte_tokenizer, facts.avlm_inputs_per_sample, facts.avlm_clip_samples),
    "text_to_image": DataSet(build_text_to_image_data, lambda model, data, device: evaluate_text_to_image(model, data),
                             facts.text_to_image_rows, facts.check_text_to_image, facts.byte_tokenizer),
    "synthetic": DataSet(build_synthetic_data, lambda model, data, device: evaluate_synthetic(model, data),
                         facts.seq_len_rows, facts.check_synthetic, facts.no_tokenizer),
    "webdataset": real_data(lambda cfg: read_webdataset),
    "jsonl": real_data(lambda cfg: partial(read_manifest, image_root=cfg.data.image_root)),
}
"""Every data set by data.name, in the order the gate's refusal lists them."""


def data_set(cfg: Config) -> DataSet:
    """The registry entry of data.name; a ConfigError naming the field and the known names if there is none."""
    entry = DATA_SETS.get(cfg.data.name)
    if entry is None:
        raise ConfigError(f"data.name = '{cfg.data.name}' is not a known data set; use one of {', '.join(DATA_SETS)}")
    return entry


def build_demo_data(cfg: Config, model: MimoModel) -> Any:
    """The data set that data.name names, built for `model`."""
    return data_set(cfg).build(cfg, model)


def evaluate_demo(cfg: Config, model: MimoModel, data: Any, device: Device) -> dict:
    """Held-out evaluation of the data set that data.name names (one process, no collective)."""
    return data_set(cfg).evaluate(model, data, device)
