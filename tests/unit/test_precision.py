"""`precision.module_dtype`: one module computes in its own dtype beside the others (SPEC 3.5, per-module precision).

The oracle is the plain model: a modality in fp32 beside a bf16 language model gives exactly the rows the
fp32 model gives without autocast, and one in bf16 beside an fp32 language model those of bf16 autocast.
Forward hooks read the dtype each module computed in, in one process (in a pipeline on 2 ranks:
test_precision_ranks.py). The memory estimate follows each module's dtype.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mimo.config.schema import ConfigError, ModuleLayoutConfig
from mimo.models.build import build_model
from mimo.models.runtime import ModelRuntime
from mimo.train.precision import step_autocast, with_module_precision
from mimo.train.trainer import Trainer
from tests.support.precision_probe import LM_LINEAR, PROJECTOR, VIT_LINEAR, record_dtypes
from tests.support.tiny_run import tiny_config


def _pixels() -> dict:
    return {"vit": {"pixel_values": torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))}}


@pytest.mark.parametrize("overrides, lm, encoder", [
    (["--precision.dtype=bfloat16", "--precision.module_dtype.images=float32"], "bfloat16", "float32"),
    (["--precision.dtype=float32", "--precision.module_dtype.images=bfloat16"], "float32", "bfloat16"),
    (["--precision.dtype=bfloat16", "--precision.module_dtype.language=float32"], "float32", "bfloat16"),
])
def test_a_modality_computes_in_its_own_dtype_beside_the_language_model(tmp_path, overrides, lm, encoder):
    cfg = tiny_config(tmp_path, *overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    plain = copy.deepcopy(model)
    runtime = with_module_precision(cfg, model, ModelRuntime())
    assert list(runtime.modality_autocast) == ["images"]
    model.set_runtime(runtime)
    seen = record_dtypes(model)
    with step_autocast(cfg, torch.device("cpu")):
        rows = model.modality_submodules["images"](_pixels())
        model.language_model(torch.randn(2, 8, 32), torch.arange(8).expand(2, 8))
    expect = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    assert seen == {VIT_LINEAR: [expect[encoder]], PROJECTOR: [expect[encoder]], LM_LINEAR: [expect[lm]]}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=encoder == "bfloat16"):
        reference = plain.modality_submodules["images"](_pixels())
    assert torch.equal(rows, reference)


def test_the_trainer_runs_each_module_in_its_dtype(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, "--precision.dtype=bfloat16", "--precision.module_dtype.images=float32"))
    seen = record_dtypes(trainer.model)
    rec = trainer.train_step(0)
    assert rec["stepped"] and torch.isfinite(torch.tensor(rec["loss"]))
    assert set(seen[VIT_LINEAR]) == set(seen[PROJECTOR]) == {torch.float32} and seen[VIT_LINEAR]
    assert set(seen[LM_LINEAR]) == {torch.bfloat16}


@pytest.mark.parametrize("override, message", [
    ("--precision.module_dtype.vision=float32", r"precision.module_dtype.vision: 'vision' is no module of this model; "
                                            r"choose from \['language', 'images'\]"),
    ("--precision.module_dtype.images=float16",
     r"precision.module_dtype.images = 'float16'; choose one of 'float32', 'bfloat16', 'float8'"),
])
def test_bad_module_dtypes_name_the_field(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, override)


def test_the_memory_estimate_follows_each_modules_dtype(tmp_path):
    from mimo.planner.candidates import layout_of, make_plan
    from mimo.planner.memory import estimate, module_sizes
    from mimo.planner.report import render

    def activations(*overrides: str) -> float:
        cfg = tiny_config(tmp_path, *overrides)
        modules = {"language": ModuleLayoutConfig(), "images": ModuleLayoutConfig()}
        return estimate(cfg, layout_of(cfg, modules, 1), module_sizes(cfg), modules).activations

    bf16 = activations("--precision.dtype=bfloat16")
    lm_fp32 = activations("--precision.dtype=bfloat16", "--precision.module_dtype.language=float32")
    all_fp32 = activations("--precision.dtype=float32")
    encoder_fp32 = activations("--precision.dtype=bfloat16", "--precision.module_dtype.images=float32")
    # layers' activations double in fp32; the logits (fp32 either way) do not
    assert bf16 < encoder_fp32 < all_fp32 and bf16 < lm_fp32 < all_fp32
    assert (lm_fp32 - bf16) + (encoder_fp32 - bf16) == pytest.approx(all_fp32 - bf16)
    cfg = tiny_config(tmp_path, "--precision.dtype=bfloat16", "--precision.module_dtype.images=float32")
    assert "bfloat16 (images float32)" in render(cfg, make_plan(cfg, 1, 80)).splitlines()[0]
