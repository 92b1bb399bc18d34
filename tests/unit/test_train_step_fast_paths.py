"""The step's fast paths of `mimo train` on one CPU process against the plain fp32 trainer: `perf.loss_rows_only`
(with and without the chunked loss), `perf.encoder_compile = "whole"` and `perf.attention_backend` leave every
loss within 1e-5 relative; `precision.master_weights` (bf16 weights, fp32 master weights and moments) stays within the
loss check's bound (max(1%, 1.5 x the gap of bf16 autocast over fp32 weights), benchmarks/loss_check.py). Keys that
cannot work in a setting are refused naming the field. (The CUDA-only key, `grad_table`:
tests/gpu/test_fast_paths_gpu.py.)"""

import dataclasses

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
    ["--perf.loss_rows_only=true"],
    ["--perf.loss_rows_only=true", "--perf.chunked_loss=true"],
    ["--perf.compile=true", "--perf.compile_backend=aot_eager", "--perf.encoder_compile=whole"],
    ["--perf.attention_backend=math"],
])
def test_numerics_neutral_switches_train_like_the_plain_trainer(tmp_path, switches):
    plain = losses(tmp_path, "plain")
    fast = losses(tmp_path, "fast", *switches)
    assert len(fast) == len(plain) == 4
    assert worst_gap(fast, plain) <= 1e-5, (fast, plain)
    torch.compiler.reset()


def test_master_weights_stay_within_the_loss_checks_bound(tmp_path):
    fp32 = losses(tmp_path, "fp32")
    autocast = losses(tmp_path, "autocast", "--precision.dtype=bfloat16")
    master = losses(tmp_path, "master", "--precision.dtype=bfloat16", "--precision.master_weights=true",
                    "--perf.loss_rows_only=true", "--perf.chunked_loss=true")
    assert master != fp32  # the bf16 path really ran
    assert worst_gap(master, fp32) <= max(1e-2, 1.5 * worst_gap(autocast, fp32)), (master, autocast, fp32)


@pytest.mark.parametrize("switches, message", [
    (["--precision.master_weights=true"],
     r"precision.master_weights = true turns the weights bf16, so it needs precision.dtype"),
    (["--perf.grad_table=true"], r"perf.grad_table = true works on MasterAdamW's update: set precision.master_weights"),
    (["--precision.dtype=bfloat16", "--precision.master_weights=true", "--perf.grad_table=true"],
     r"perf.grad_table = true needs a GPU \(train.device = \"cuda\", got \"cpu\"\)"),
    (["--perf.encoder_compile=graphs"], r"perf.encoder_compile = 'graphs'; choose one of 'blocks', 'whole'"),
    (["--perf.attention_backend=fa4"], r"perf.attention_backend = 'fa4'; choose one of 'default', 'cudnn'"),
])
def test_a_key_that_cannot_work_is_refused_naming_it(tmp_path, switches, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, *switches)


def test_layouts_refuse_what_they_cannot_run(tmp_path):
    cfg = tiny_config(tmp_path, "--precision.dtype=bfloat16", "--precision.master_weights=true")
    check_fast_path_layout(cfg, Layout.from_config({}, cfg.model.module_names, 2))  # ZeRO-1 over 2 lanes
    cfg = tiny_config(tmp_path, "--precision.dtype=bfloat16", "--precision.master_weights=true")
    cfg = dataclasses.replace(cfg, perf=dataclasses.replace(cfg.perf, grad_table=True))  # as on a GPU
    with pytest.raises(ConfigError, match=r"perf.grad_table = true runs on one process only"):
        check_fast_path_layout(cfg, Layout.from_config({}, cfg.model.module_names, 2))
    cfg = tiny_config(tmp_path, "--precision.dtype=bfloat16", "--precision.master_weights=true",
                      "--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
                      "--parallel.modules.language.offset=1", "--parallel.modules.language.size=1")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))  # per stage
    cfg = tiny_config(tmp_path, "--perf.loss_rows_only=true", "--perf.chunked_loss=true",
                      "--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))  # shard rows
    cfg = tiny_config(tmp_path, "--perf.loss_rows_only=true", "--perf.chunked_loss=true",
                      "--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
                      "--parallel.modules.language.offset=1", "--parallel.modules.language.size=2",
                      "--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 3))  # shard rows
    cfg = tiny_config(tmp_path, "--perf.loss_rows_only=true", "--perf.chunked_loss=true",
                      "--parallel.modules.language.cp=2", "--parallel.modules.language.tp=2")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 4))  # own rows
    cfg = tiny_config(tmp_path, "--perf.loss_rows_only=true", "--parallel.modules.images.offset=0",
                      "--parallel.modules.images.size=1", "--parallel.modules.language.offset=1",
                      "--parallel.modules.language.size=2", "--parallel.modules.language.cp=2")
    check_fast_path_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 3))  # CP-cut rows
