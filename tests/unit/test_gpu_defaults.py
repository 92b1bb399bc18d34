"""The GPU defaults of `mimo train` (mimo.perf.gpu_defaults): which unset train keys take their fast value on
CUDA, on which layouts, and that a key the user set, a CPU run or a Config built in Python keeps its own."""

from __future__ import annotations

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.parallel.layout import Layout
from mimo.perf.gpu_defaults import GPU_DEFAULTS, apply_gpu_defaults
from mimo.train.gate import validate_run
from tests.support.configs import CONFIGS, T2I

VLM = CONFIGS / "demo_vlm.toml"
EVERY_KEY = dict(GPU_DEFAULTS)


def cuda_config(*overrides: str, path=VLM):
    return load_config(path, ["--train.device=cuda", *overrides])


def layout_of(cfg, world: int) -> Layout:
    return Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world)


def test_one_process_takes_every_gpu_default():
    cfg = cuda_config()
    applied = apply_gpu_defaults(cfg, None)
    assert applied == EVERY_KEY
    assert {k: getattr(cfg.train, k) for k in EVERY_KEY} == EVERY_KEY
    assert (cfg.train.lm_update_early, cfg.train.step_graph) == (False, False)  # opt-in only


def test_keys_the_user_set_are_kept():
    cfg = cuda_config("--train.compile=false", "--train.attention_backend=flash")
    applied = apply_gpu_defaults(cfg, None)
    assert "compile" not in applied and "attention_backend" not in applied
    assert (cfg.train.compile, cfg.train.attention_backend) == (False, "flash")
    assert cfg.train.encoder_compile == "whole"  # takes effect only under compile, refused by nothing


def test_an_fp32_module_keeps_fp32_weights_and_sdpa_default():
    cfg = cuda_config("--train.module_dtype.images=float32")
    applied = apply_gpu_defaults(cfg, None)
    assert applied["dtype"] == "bfloat16"
    for key in ("master_weights", "grad_table", "attention_backend"):  # bf16 weights / cuDNN need bf16 everywhere
        assert key not in applied
    assert cfg.train.attention_backend == "default" and not cfg.train.master_weights


def test_data_parallel_layout_drops_the_one_process_keys():
    cfg = cuda_config()
    applied = apply_gpu_defaults(cfg, layout_of(cfg, 2))
    assert "grad_table" not in applied and not cfg.train.grad_table
    assert applied["master_weights"] is True and applied["loss_rows_only"] is True


def test_pipelined_layout_takes_master_weights_and_the_labelled_rows():
    cfg = cuda_config("--parallel.modules.images.size=1", "--parallel.modules.language.offset=1",
                      "--parallel.modules.language.size=1")
    applied = apply_gpu_defaults(cfg, layout_of(cfg, 2))
    assert applied["master_weights"] is True and applied["loss_rows_only"] is True
    assert applied["compile"] is True and applied["chunked_loss"] is True


def test_sharded_sequences_take_the_labelled_rows():
    cfg = cuda_config("--parallel.modules.language.cp=2", "--parallel.modules.language.tp=2")
    assert apply_gpu_defaults(cfg, layout_of(cfg, 4))["loss_rows_only"] is True  # each CP rank's own rows
    cfg = cuda_config("--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true")
    applied = apply_gpu_defaults(cfg, layout_of(cfg, 2))  # each TP rank's rows of its own shard
    assert applied["loss_rows_only"] is True and applied["chunked_loss"] is True


def test_out_path_keeps_every_row():
    cfg = cuda_config(path=T2I)
    applied = apply_gpu_defaults(cfg, None)
    assert "loss_rows_only" not in applied and applied["chunked_loss"] is True


def test_logit_softcap_keeps_the_full_logits():
    cfg = cuda_config("--model.llm.logit_softcap=30.0")
    assert "chunked_loss" not in apply_gpu_defaults(cfg, None)


def test_cpu_and_python_configs_keep_their_defaults():
    cpu = load_config(VLM)
    assert apply_gpu_defaults(cpu, None) == {} and cpu.train.dtype == "float32"
    built = cuda_config()
    built.train.left_unset = frozenset()  # a Config built in Python names every key it means
    assert apply_gpu_defaults(built, None) == {}
    off = cuda_config("--train.gpu_defaults=false")
    assert apply_gpu_defaults(off, None) == {} and off.train.dtype == "float32" and not off.train.compile


def test_load_config_records_the_keys_left_unset():
    cfg = load_config(VLM, ["--train.compile=true"])
    assert "compile" not in cfg.train.left_unset and "steps" not in cfg.train.left_unset  # the TOML sets steps
    assert {"dtype", "master_weights", "chunked_loss"} <= cfg.train.left_unset
    with pytest.raises(ConfigError, match="unknown config key 'train.left_unset'"):
        load_config(VLM, ["--train.left_unset=1"])



@pytest.mark.parametrize("opt_in", [["--train.step_graph=true", "--optim.clip=0"], ["--train.grad_table=true"],
                                    ["--train.lm_update_early=true", "--optim.clip=0"]])
def test_a_key_needing_master_weights_takes_them_from_the_gpu_defaults(opt_in, monkeypatch):
    """Left unset, train.dtype and train.master_weights are the GPU defaults' to set: the config-alone check
    leaves what needs them to the gate, which checks it after the defaults."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = cuda_config(*opt_in)
    assert not cfg.train.master_weights  # load_config leaves it to the gate's GPU defaults
    applied = validate_run(cfg, 1)
    assert applied["dtype"] == "bfloat16" and applied["master_weights"] is True
    with pytest.raises(ConfigError, match=r"works on MasterAdamW's update: set train.master_weights = true"):
        cuda_config(*opt_in, "--train.gpu_defaults=false")


def test_the_gate_refuses_a_key_whose_master_weights_the_defaults_could_not_set(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = cuda_config("--train.step_graph=true", "--optim.clip=0", "--train.module_dtype.images=float32")
    with pytest.raises(ConfigError, match=r"train.step_graph = true works on MasterAdamW's update: set "
                                          r"train.master_weights = true"):
        validate_run(cfg, 1)  # an fp32 module keeps fp32 weights, so master_weights stays off


HALF_ONLY_FP32 = [(["--train.attention_backend=cudnn", "--train.gpu_defaults=false"], "language"),
                  (["--train.attention_backend=flash", "--train.module_dtype.images=float32"], "images")]


@pytest.mark.parametrize("overrides, module", HALF_ONLY_FP32)
def test_a_half_only_attention_backend_with_an_fp32_module_is_refused_at_load(overrides, module):
    """cuDNN and flash attention have no fp32 kernels: allowed alone, an fp32 module's first attention would
    find none (torch's "No available kernel") after the gate."""
    with pytest.raises(ConfigError, match=rf"train.attention_backend = \"(cudnn|flash)\" has no float32 kernels, and "
                                          rf"module '{module}' computes in float32"):
        cuda_config(*overrides)


def test_cudnn_attention_with_train_dtype_unset_takes_the_gpu_default_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = cuda_config("--train.attention_backend=cudnn")
    assert validate_run(cfg, 1)["dtype"] == "bfloat16" and cfg.train.attention_backend == "cudnn"
