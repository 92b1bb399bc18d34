"""The GPU defaults of `mimo train` (mimo.perf.gpu_defaults): which unset fast-path keys take their fast value on
CUDA, on which layouts, and that a key the user set, a CPU run or a Config built in Python keeps its own; the
config the run trains with is a resolved copy, with each key's value and why."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.parallel.layout import Layout
from mimo.perf.gpu_defaults import GPU_DEFAULTS, config_value, fast_paths_note, resolve_gpu_defaults
from mimo.train import trainer as trainer_module
from mimo.train.gate import validate_run
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS, T2I
from tests.support.tiny_run import tiny_config

VLM = CONFIGS / "demo_vlm.toml"
EVERY_KEY = {key: value for key, value, _ in GPU_DEFAULTS}


def cuda_config(*overrides: str, path=VLM):
    return load_config(path, ["--train.device=cuda", *overrides])


def layout_of(cfg, world: int) -> Layout:
    return Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world)


def set_by_defaults(cfg, layout):
    """Resolve `cfg` on `layout`: (the resolved config, {key: value} of the keys the GPU defaults set)."""
    resolved, notes = resolve_gpu_defaults(cfg, layout)
    return resolved, {key: value for key, value, why in notes if why.startswith("GPU default:")}


def test_one_process_takes_every_gpu_default():
    written = cuda_config()
    cfg, applied = set_by_defaults(written, None)
    assert applied == EVERY_KEY
    assert {k: config_value(cfg, k) for k in EVERY_KEY} == EVERY_KEY
    assert not written.perf.compile and written.precision.dtype == "float32"  # the config as written is left alone


def test_keys_the_user_set_are_kept():
    cfg, applied = set_by_defaults(cuda_config("--perf.compile=false", "--perf.attention_backend=flash"), None)
    assert "perf.compile" not in applied and "perf.attention_backend" not in applied
    assert (cfg.perf.compile, cfg.perf.attention_backend) == (False, "flash")
    assert cfg.perf.encoder_compile == "whole"  # takes effect only under compile, refused by nothing


def test_an_fp32_module_keeps_fp32_weights_and_sdpa_default():
    cfg, applied = set_by_defaults(cuda_config("--precision.module_dtype.images=float32"), None)
    assert applied["precision.dtype"] == "bfloat16"
    for key in ("precision.master_weights", "perf.grad_table", "perf.attention_backend"):  # need bf16 everywhere
        assert key not in applied
    assert cfg.perf.attention_backend == "default" and not cfg.precision.master_weights


def test_data_parallel_layout_drops_the_one_process_keys():
    cfg = cuda_config()
    cfg, applied = set_by_defaults(cfg, layout_of(cfg, 2))
    assert "perf.grad_table" not in applied and not cfg.perf.grad_table
    assert applied["precision.master_weights"] is True and applied["perf.loss_rows_only"] is True


def test_pipelined_layout_takes_master_weights_and_the_labelled_rows():
    cfg = cuda_config("--parallel.modules.images.size=1", "--parallel.modules.language.offset=1",
                      "--parallel.modules.language.size=1")
    _, applied = set_by_defaults(cfg, layout_of(cfg, 2))
    assert applied["precision.master_weights"] is True and applied["perf.loss_rows_only"] is True
    assert applied["perf.compile"] is True and applied["perf.chunked_loss"] is True


def test_sharded_sequences_take_the_labelled_rows():
    cfg = cuda_config("--parallel.modules.language.cp=2", "--parallel.modules.language.tp=2")
    assert set_by_defaults(cfg, layout_of(cfg, 4))[1]["perf.loss_rows_only"] is True  # each CP rank's own rows
    cfg = cuda_config("--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true")
    _, applied = set_by_defaults(cfg, layout_of(cfg, 2))  # each TP rank's rows of its own shard
    assert applied["perf.loss_rows_only"] is True and applied["perf.chunked_loss"] is True


def test_out_path_keeps_every_row():
    _, applied = set_by_defaults(cuda_config(path=T2I), None)
    assert "perf.loss_rows_only" not in applied and applied["perf.chunked_loss"] is True


def test_logit_softcap_keeps_the_full_logits():
    cfg = cuda_config("--model.llm.logit_softcap=30.0")
    cfg, notes = resolve_gpu_defaults(cfg, None)
    assert not cfg.perf.chunked_loss
    assert any(k == "perf.chunked_loss" and "refused: model.llm.logit_softcap" in why for k, _, why in notes), notes


def test_cpu_and_python_configs_keep_their_defaults():
    cpu, notes = resolve_gpu_defaults(load_config(VLM), None)
    assert notes == [] and cpu == load_config(VLM) and fast_paths_note(notes) == ""
    built = cuda_config()
    built.left_unset = frozenset()  # a Config built in Python names every key it means
    resolved, notes = resolve_gpu_defaults(built, None)
    assert resolved == built and {why for _, _, why in notes} == {"set in the config"}
    off, notes = resolve_gpu_defaults(cuda_config("--perf.gpu_defaults=false"), None)
    assert notes == [] and off.precision.dtype == "float32" and not off.perf.compile


def test_load_config_records_the_keys_left_unset():
    cfg = load_config(VLM, ["--perf.compile=true"])
    assert "perf.compile" not in cfg.left_unset and "train.steps" not in cfg.left_unset  # the TOML sets steps
    assert {"precision.dtype", "precision.master_weights", "perf.chunked_loss"} <= cfg.left_unset
    with pytest.raises(ConfigError, match="unknown config key 'left_unset'"):
        load_config(VLM, ["--left_unset=1"])


def test_the_note_names_each_key_its_value_and_why():
    _, notes = resolve_gpu_defaults(cuda_config("--perf.compile=false", "--precision.module_dtype.images=float32"),
                                    None)
    lines = fast_paths_note(notes).splitlines()
    assert lines[0].startswith("mimo: fast paths on CUDA") and len(lines) == 1 + len(GPU_DEFAULTS)
    assert "  perf.compile = false  (set in the config)" in lines
    assert "  precision.dtype = 'bfloat16'  (GPU default: bf16 autocast runs the matmuls on tensor cores)" in lines
    assert any(line.startswith("  perf.attention_backend = 'default'  (GPU default 'cudnn' refused: ")
               for line in lines), lines



def test_a_key_needing_master_weights_takes_them_from_the_gpu_defaults(monkeypatch):
    """Left unset, precision.dtype and precision.master_weights are the GPU defaults' to set: the config-alone check
    leaves what needs them to the gate, which checks it after the defaults."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = cuda_config("--perf.grad_table=true")
    assert not cfg.precision.master_weights  # load_config leaves it to the gate's GPU defaults
    run, _ = validate_run(cfg, 1)
    assert run.precision.dtype == "bfloat16" and run.precision.master_weights is True
    with pytest.raises(ConfigError, match=r"works on MasterAdamW's update: set precision.master_weights = true"):
        cuda_config("--perf.grad_table=true", "--perf.gpu_defaults=false")


def test_the_gate_refuses_a_key_whose_master_weights_the_defaults_could_not_set(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = cuda_config("--perf.grad_table=true", "--precision.module_dtype.images=float32")
    with pytest.raises(ConfigError, match=r"perf.grad_table = true works on MasterAdamW's update: set "
                                          r"precision.master_weights = true"):
        validate_run(cfg, 1)  # an fp32 module keeps fp32 weights, so master_weights stays off


HALF_ONLY_FP32 = [(["--perf.attention_backend=cudnn", "--perf.gpu_defaults=false"], "language"),
                  (["--perf.attention_backend=flash", "--precision.module_dtype.images=float32"], "images")]


@pytest.mark.parametrize("overrides, module", HALF_ONLY_FP32)
def test_a_half_only_attention_backend_with_an_fp32_module_is_refused_at_load(overrides, module):
    """cuDNN and flash attention have no fp32 kernels: allowed alone, an fp32 module's first attention would
    find none (torch's "No available kernel") after the gate."""
    with pytest.raises(ConfigError, match=rf"perf.attention_backend = \"(cudnn|flash)\" has no float32 kernels, and "
                                          rf"module '{module}' computes in float32"):
        cuda_config(*overrides)


def test_cudnn_attention_with_train_dtype_unset_takes_the_gpu_default_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = cuda_config("--perf.attention_backend=cudnn")
    run, notes = validate_run(cfg, 1)
    assert run.precision.dtype == "bfloat16" and run.perf.attention_backend == "cudnn"
    assert ("precision.dtype", "bfloat16", f"GPU default: {GPU_DEFAULTS[0][2]}") in notes
    assert cfg.precision.dtype == "float32"  # the config as loaded is left alone


def test_the_run_trains_with_prints_once_and_writes_the_resolved_config(tmp_path, monkeypatch, capsys):
    """The trainer takes the config validate_run resolved (here a stand-in: the gate's own resolution needs a
    GPU), prints its fast paths once, and writes that config, not the one loaded, to config.toml."""
    cfg = tiny_config(tmp_path, "--train.steps=1")

    def resolved(loaded, world):
        run = copy.copy(loaded)
        run.perf = dataclasses.replace(loaded.perf, fuse_qkv=True)
        return run, [("perf.fuse_qkv", True, "GPU default: q, k and v from one matmul")]

    monkeypatch.setattr(trainer_module, "validate_run", resolved)
    Trainer(cfg).train()
    assert not cfg.perf.fuse_qkv  # the loaded config is left alone
    written = load_config(tmp_path / "tiny" / "config.toml")
    assert written.perf.fuse_qkv and written.train == cfg.train
    assert capsys.readouterr().err.count("  perf.fuse_qkv = true  (GPU default: q, k and v from one matmul)") == 1


def test_packing_takes_the_row_length_unless_the_user_named_one():
    cfg, applied = set_by_defaults(cuda_config("--data.seq_len=96"), None)
    assert applied["data.packing"] is True and cfg.data.pack_length == 96
    cfg, _ = set_by_defaults(cuda_config("--data.pack_length=256"), None)
    assert cfg.data.packing and cfg.data.pack_length == 256
    kept, applied = set_by_defaults(cuda_config("--data.packing=false"), None)
    assert "data.packing" not in applied and not kept.data.packing and kept.data.pack_length == 0


@pytest.mark.parametrize("overrides, reason", [
    (["--data.name=synthetic"], "synthetic rows are full"),
    (["--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_aux_loss_weight=0.01"], "router losses"),
])
def test_packing_stays_off_where_the_gate_refuses_it(overrides, reason):
    cfg, notes = resolve_gpu_defaults(cuda_config(*overrides), None)
    assert not cfg.data.packing and cfg.data.pack_length == 0
    assert any(k == "data.packing" and "refused" in why and reason in why for k, _, why in notes), notes
