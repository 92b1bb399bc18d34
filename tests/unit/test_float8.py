"""precision.module_dtype.<m> = "float8": the gate's refusals (CPU, a GPU without FP8, no torchao, tensor
parallelism), exactly which linears convert and which stay, and a run whose FP8 products are a CPU reference
(quantise-dequantise through torch.float8_e4m3fn with one scale per tensor) trains like the bf16 run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mimo.cli import main
from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.models.build import build_model
from mimo.parallel.layout import Layout
from mimo.perf import gpu_defaults
from mimo.perf.apply import apply_fast_paths
from mimo.perf.float8 import float8_linears
from mimo.perf.gpu_defaults import GPU_DEFAULTS, resolve_gpu_defaults
from mimo.train.gate import check_layout, validate_run
from tests.support.float8_reference import SWAPPED, float8_reference
from tests.support.tiny_run import DEMO, TINY, train_losses

FP8_LM = ["--precision.dtype=bfloat16", "--precision.module_dtype.language=float8"]


def tiny_cfg(*overrides: str):
    return load_config(DEMO, [*TINY, *overrides])


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate_run(tiny_cfg(*overrides), 1)
    return str(err.value)


def test_float8_on_a_cpu_is_refused_by_mimo_train_naming_the_field(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(DEMO), *TINY, f"--run.out_dir={tmp_path / 'runs'}", *FP8_LM])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and not (tmp_path / "runs").exists()
    assert 'mimo: error: precision.module_dtype.language = "float8" computes its linears with the GPU\'s FP8' in err
    assert 'train.device = "cpu" has not; use train.device = "cuda"' in err


def fake_gpu(monkeypatch, capability: tuple[int, int], name: str = "NVIDIA H200") -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_float8_on_a_gpu_without_fp8_or_without_torchao_is_refused(monkeypatch):
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB")
    message = refusal(*FP8_LM, "--train.device=cuda")
    assert ('precision.module_dtype.language = "float8" needs FP8 matrix instructions (compute capability >= 8.9'
            in message)
    assert "NVIDIA A100-SXM4-80GB has 8.0" in message
    fake_gpu(monkeypatch, (9, 0))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    message = refusal("--precision.dtype=bfloat16", "--precision.module_dtype.images=float8", "--train.device=cuda")
    assert "precision.module_dtype.images = \"float8\" trains through torchao's float8 training, which is not " \
           "installed; pip install 'mimo[fp8]'" in message


@pytest.mark.parametrize("overrides, message", [
    (["--precision.module_dtype.language=float8"], 'float8" computes the rest of the module in bf16, so it needs '
                                                   'precision.dtype = "bfloat16" (got "float32")'),
    ([*FP8_LM, "--precision.float8_recipe=blockwise"], "precision.float8_recipe = 'blockwise'; choose one of "
                                                       "'tensorwise', 'rowwise'"),
    (["--precision.dtype=bfloat16", "--precision.module_dtype.language=fp8"], "precision.module_dtype.language = "
                                                                              "'fp8'; choose one of 'float32', "
                                                                              "'bfloat16', 'float8'"),
])
def test_float8_config_mistakes_are_refused_by_the_config_check(overrides, message):
    assert message in refusal(*overrides)


def test_float8_under_tensor_parallelism_is_refused_at_the_gate():
    cfg = tiny_cfg(*FP8_LM, "--parallel.modules.language.tp=2", "--model.llm.kv_heads=2")
    with pytest.raises(ConfigError, match=r'precision.module_dtype.language = "float8" with '
                                          r'parallel.modules.language.tp = 2: FP8 linears do not compose .* set '
                                          r'parallel.modules.language.tp = 1'):
        check_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))
    cfg = tiny_cfg(*FP8_LM, "--parallel.modules.images.tp=2")  # the LM's FP8 beside a tensor-parallel ViT is fine
    check_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))


LM_LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj"]


def names_of(*overrides: str) -> list[str]:
    cfg = tiny_cfg(*overrides)
    model = build_model(cfg.model)
    apply_fast_paths(cfg, model, float8_swap=lambda root, keep: None)
    return sorted(float8_linears(model, cfg))


def test_which_linears_compute_in_float8():
    """The LM's: every projection of every layer, not its head; under fuse_qkv not q/k/v; a dim that is no
    multiple of 16 stays. A ViT's: its blocks' linears and the projector (its patch embedding is a convolution)."""
    lm = sorted(f"language_model.layers.{i}.{n}" for i in range(2) for n in LM_LAYER)
    assert names_of(*FP8_LM, "--model.llm.layers=2") == lm
    assert names_of(*FP8_LM, "--model.llm.layers=2", "--perf.fuse_qkv=true") == [
        n for n in lm if n.split(".")[-1] not in ("q_proj", "k_proj", "v_proj")]
    assert names_of(*FP8_LM, "--model.llm.layers=2", "--model.llm.mlp=72") == [n for n in lm if "_proj" in n and
                                                                                "mlp" not in n]
    vit = "modality_submodules.images.encoders.vit"
    images = names_of("--precision.dtype=bfloat16", "--precision.module_dtype.images=float8")
    assert images == sorted([f"{vit}.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")] +
                            [f"{vit}.layers.0.mlp.fc1", f"{vit}.layers.0.mlp.fc2",
                             "modality_submodules.images.input_projections.0.fc1",
                             "modality_submodules.images.input_projections.0.fc2"])
    odd_mlp = names_of("--precision.dtype=bfloat16", "--precision.module_dtype.images=float8",
                       "--model.modalities.images.vit.mlp=72")
    assert odd_mlp == [n for n in images if ".mlp." not in n]
    assert names_of("--precision.dtype=bfloat16") == []


def test_a_float8_run_with_the_cpu_reference_trains_like_the_fp32_run(tmp_path: Path):
    """The config path of `mimo train` end to end (gate, build, apply_fast_paths, training, checkpoint), with the
    device checks lifted and torchao's Float8Linear replaced by tests/support/float8_reference.py's QDQLinear:
    exactly the LM's projections swap, and the loss stays within 1% of the fp32 run's at every step (3.0e-4 here;
    bf16 alone 3.6e-5), finite and not equal to the bf16 run's."""
    fp32 = train_losses(tmp_path / "fp32", "--train.steps=12")
    bf16 = train_losses(tmp_path / "bf16", "--precision.dtype=bfloat16", "--train.steps=12")
    with float8_reference():
        fp8 = train_losses(tmp_path / "fp8", *FP8_LM, "--train.steps=12")
    assert sorted(SWAPPED) == sorted(f"language_model.layers.0.{n}" for n in LM_LAYER)
    assert len(fp8) == len(fp32) == 12 and all(torch.isfinite(torch.tensor(fp8)))
    gap = max(abs(a - b) / b for a, b in zip(fp8, fp32))
    print("max relative loss gap vs fp32: QDQ float8", gap, "bf16", max(abs(a - b) / b for a, b in zip(bf16, fp32)))
    assert 0 < gap < 1e-2 and fp8 != bf16


def test_torchao_converts_the_same_linears_and_keeps_every_name():
    Float8Linear = pytest.importorskip("torchao.float8.float8_linear").Float8Linear

    cfg = tiny_cfg(*FP8_LM, "--perf.fuse_qkv=true")
    model = build_model(cfg.model)
    before = list(model.state_dict())
    apply_fast_paths(cfg, model)
    converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert converted == sorted(
        f"language_model.layers.0.{n}" for n in LM_LAYER if "q_proj" not in n and "k_proj" not in n
        and "v_proj" not in n)
    assert list(model.state_dict()) == before


def test_a_float8_module_takes_the_gpu_defaults_of_a_bf16_one():
    """Its attention, norms and the rest compute in bf16, so cuDNN attention (bf16 only) is its default too."""
    cfg, _ = resolve_gpu_defaults(tiny_cfg("--train.device=cuda", *FP8_LM), None)
    assert cfg.perf.attention_backend == "cudnn" and cfg.perf.fuse_qkv is True


def fp8_gpu(monkeypatch) -> None:
    """A Hopper GPU with torchao, as far as the gate can tell (this machine has neither)."""
    fake_gpu(monkeypatch, (9, 0))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torchao" else real(name, *a))


def test_float8_with_train_dtype_unset_takes_the_gpu_default_bf16(monkeypatch):
    """On CUDA the GPU defaults set the unset precision.dtype to bf16, so the float8 module's need holds after them."""
    fp8_gpu(monkeypatch)
    cfg = tiny_cfg("--train.device=cuda", "--precision.module_dtype.language=float8")
    assert cfg.precision.dtype == "float32"  # load_config leaves it to the gate's GPU defaults
    assert validate_run(cfg, 1)[0].precision.dtype == "bfloat16"


@pytest.mark.parametrize("overrides", [["--perf.gpu_defaults=false"], ["--precision.dtype=float32"]])
def test_float8_without_the_gpu_default_dtype_is_refused_at_load(overrides, monkeypatch):
    fp8_gpu(monkeypatch)
    with pytest.raises(ConfigError, match=r'float8" computes the rest of the module in bf16, so it needs '
                                          r'precision.dtype = "bfloat16" \(got "float32"\)'):
        tiny_cfg("--train.device=cuda", "--precision.module_dtype.language=float8", *overrides)


def test_the_gate_rechecks_float8_when_the_gpu_defaults_leave_train_dtype(monkeypatch):
    fp8_gpu(monkeypatch)
    monkeypatch.setattr(gpu_defaults, "GPU_DEFAULTS", tuple(kv for kv in GPU_DEFAULTS if kv[0] != "precision.dtype"))
    cfg = tiny_cfg("--train.device=cuda", "--precision.module_dtype.language=float8")  # as if bf16 could not apply
    with pytest.raises(ConfigError, match=r'needs precision.dtype = "bfloat16" \(got "float32"\)'):
        validate_run(cfg, 1)
