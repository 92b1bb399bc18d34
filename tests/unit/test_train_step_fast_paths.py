"""The step's fast paths of `mimo train` on one CPU process against the plain fp32 trainer: `train.loss_rows_only`
(with and without the chunked loss), `train.encoder_compile = "whole"` and `train.attention_backend` leave every
loss within 1e-5 relative; `train.master_weights` (bf16 weights, fp32 master weights and moments) stays within the
loss check's bound (max(1%, 1.5 x the gap of bf16 autocast over fp32 weights), benchmarks/loss_check.py), and its
early language-model update (`train.lm_update_early`, inside backward) changes nothing against it. Keys that
cannot work in a setting are refused naming the field. (The CUDA-only keys, `grad_table` and `step_graph`:
tests/gpu/test_fast_paths_gpu.py.)"""

import pytest
import torch

from mimo.config.schema import ConfigError
from mimo.parallel.layout import Layout
from mimo.perf.apply import check_fast_path_layout
from tests.support.tiny_run import tiny_config, train_losses

STEPS = ["--train.steps=4", "--optim.clip=0"]


def losses(tmp_path, name: str, *switches: str) -> list[float]:
    return train_losses(tmp_path / name, *STEPS, *switches)


def worst_gap(curve: list[float], ref: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(curve, ref))


@pytest.mark.parametrize("switches", [
    ["--train.loss_rows_only=true"],
    ["--train.loss_rows_only=true", "--train.chunked_loss=true"],
    ["--train.compile=true", "--train.compile_backend=aot_eager", "--train.encoder_compile=whole"],
    ["--train.attention_backend=math"],
])
def test_numerics_neutral_switches_train_like_the_plain_trainer(tmp_path, switches):
    plain = losses(tmp_path, "plain")
    fast = losses(tmp_path, "fast", *switches)
    assert len(fast) == len(plain) == 4
    assert worst_gap(fast, plain) <= 1e-5, (fast, plain)
    torch.compiler.reset()


def test_master_weights_stay_within_the_loss_checks_bound_and_the_early_update_changes_nothing(tmp_path):
    fp32 = losses(tmp_path, "fp32")
    autocast = losses(tmp_path, "autocast", "--train.dtype=bfloat16")
    master = losses(tmp_path, "master", "--train.dtype=bfloat16", "--train.master_weights=true",
                    "--train.loss_rows_only=true", "--train.chunked_loss=true")
    early = losses(tmp_path, "early", "--train.dtype=bfloat16", "--train.master_weights=true",
                   "--train.loss_rows_only=true", "--train.chunked_loss=true", "--train.lm_update_early=true")
    assert master != fp32  # the bf16 path really ran
    assert worst_gap(master, fp32) <= max(1e-2, 1.5 * worst_gap(autocast, fp32)), (master, autocast, fp32)
    assert worst_gap(early, master) <= 1e-5, (early, master)


@pytest.mark.parametrize("switches, message", [
    (["--train.master_weights=true"], r"train.master_weights = true turns the weights bf16, so it needs train.dtype"),
    (["--train.grad_table=true"], r"train.grad_table = true works on MasterAdamW's update: set train.master_weights"),
    (["--train.dtype=bfloat16", "--train.master_weights=true", "--train.step_graph=true"],
     r"train.step_graph = true needs a GPU \(train.device = \"cuda\", got \"cpu\"\)"),
    (["--train.dtype=bfloat16", "--train.master_weights=true", "--train.lm_update_early=true", "--optim.clip=1.0"],
     r"train.lm_update_early = true updates the weights inside the step, .* set optim.clip = 0"),
    (["--train.dtype=bfloat16", "--train.master_weights=true", "--train.lm_update_early=true", "--optim.clip=0",
      "--parallel.microbatches=2"], r"takes parallel.microbatches = 1 \(got 2\)"),
    (["--train.encoder_compile=graphs"], r"train.encoder_compile = 'graphs'; choose one of blocks, whole"),
    (["--train.attention_backend=fa4"], r"train.attention_backend = 'fa4'; choose one of default, cudnn"),
])
def test_a_key_that_cannot_work_is_refused_naming_it(tmp_path, switches, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, *switches)


def test_layouts_refuse_what_they_cannot_run(tmp_path):
    cfg = tiny_config(tmp_path, "--train.dtype=bfloat16", "--train.master_weights=true")
    check_fast_path_layout(cfg, Layout.from_config({}, cfg.model.module_names, 2))  # ZeRO-1 over 2 lanes
    cfg = tiny_config(tmp_path, "--train.dtype=bfloat16", "--train.master_weights=true", "--train.lm_update_early=true",
                      "--optim.clip=0")
    with pytest.raises(ConfigError, match=r"train.lm_update_early = true runs on one process only"):
        check_fast_path_layout(cfg, Layout.from_config({}, cfg.model.module_names, 2))
    cfg = tiny_config(tmp_path, "--train.dtype=bfloat16", "--train.master_weights=true",
                      "--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
                      "--parallel.modules.language.offset=1", "--parallel.modules.language.size=1")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))  # per stage
    cfg = tiny_config(tmp_path, "--train.loss_rows_only=true", "--train.chunked_loss=true",
                      "--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))  # shard rows
    cfg = tiny_config(tmp_path, "--train.loss_rows_only=true", "--train.chunked_loss=true",
                      "--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
                      "--parallel.modules.language.offset=1", "--parallel.modules.language.size=2",
                      "--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 3))  # shard rows
    cfg = tiny_config(tmp_path, "--train.loss_rows_only=true", "--train.chunked_loss=true",
                      "--parallel.modules.language.cp=2", "--parallel.modules.language.tp=2")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 4))  # own rows
    cfg = tiny_config(tmp_path, "--train.loss_rows_only=true", "--parallel.modules.images.offset=0",
                      "--parallel.modules.images.size=1", "--parallel.modules.language.offset=1",
                      "--parallel.modules.language.size=2", "--parallel.modules.language.cp=2")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 3))  # CP-cut rows
