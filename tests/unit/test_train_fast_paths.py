"""`perf.compile`, `perf.chunked_loss`, `perf.fuse_qkv` and `perf.activation_checkpointing` (here on the CPU
in fp32) train like the plain trainer: per-step losses within 1e-5 (chunked, fused q/k/v; FSDP with fused q/k/v
or checkpointing: tests/distributed/test_data_parallel.py), 1e-6 (checkpointed) or 1e-4 (compiled) relative,
final weights within 1e-4 of their scale (every layout: tests/distributed/test_fast_path_layouts.py).
Checkpointing keeps less for the backward. An unknown module name or compile backend is refused with an error
that names the field."""

import pytest
import torch

from mimo.config.schema import ConfigError
from mimo.models.build import build_model
from mimo.perf.apply import apply_fast_paths
from mimo.train.checkpoint.weights import load_run
from tests.support.tiny_run import tiny_config, train_losses

STEPS = ["--train.steps=4"]


def run(tmp_path, name: str, *switches: str) -> tuple[list[float], dict]:
    out = tmp_path / name
    losses = train_losses(out, *STEPS, *switches)
    return losses, load_run(out / "tiny")[1].state_dict()


@pytest.mark.parametrize("switches, rtol", [
    (["--perf.chunked_loss=true"], 1e-5),
    (["--perf.compile=true"], 1e-4),
    (["--perf.fuse_qkv=true"], 1e-5),
    (['--perf.activation_checkpointing=["language", "images"]'], 1e-6),
])
def test_fast_path_trains_like_the_plain_trainer(tmp_path, switches, rtol):
    plain_losses, plain = run(tmp_path, "plain")
    fast_losses, fast = run(tmp_path, "fast", *switches)
    assert len(fast_losses) == len(plain_losses) == 4
    for a, b in zip(fast_losses, plain_losses):
        assert abs(a - b) <= rtol * abs(b), (fast_losses, plain_losses)
    for name, w in plain.items():
        # Adam divides each gradient by its own running scale, so fp32 rounding of a different summation
        # order reaches the weights relatively larger than the losses; a key bias's exact gradient is zero
        # (softmax is shift invariant per query), so there both runs step on rounding noise alone.
        slack = 1e-6 if name.endswith("k_proj.bias") else 0.0
        assert (fast[name] - w).abs().max() <= 1e-4 * w.abs().max() + slack, name
    torch.compiler.reset()


def _saved_bytes(model, x: torch.Tensor, positions: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward of the language model's forward over `x`."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.language_model(x, positions).sum().backward()
    return total


def test_activation_checkpointing_keeps_less_for_the_backward(tmp_path):
    """Checkpointed decoder layers keep their inputs only: the forward saves a fraction of the plain bytes,
    and the backward (which recomputes them) gives the same input gradient."""
    plain_cfg = tiny_config(tmp_path, "--model.llm.layers=3")
    ckpt_cfg = tiny_config(tmp_path, "--model.llm.layers=3", '--perf.activation_checkpointing=["language"]')
    torch.manual_seed(0)
    plain, ckpt = build_model(plain_cfg.model), build_model(plain_cfg.model)
    ckpt.load_state_dict(plain.state_dict())
    apply_fast_paths(ckpt_cfg, ckpt)
    x = torch.randn(2, 24, 32)
    positions = torch.arange(24).expand(2, 24)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    saved_plain, saved_ckpt = _saved_bytes(plain, xs[0], positions), _saved_bytes(ckpt, xs[1], positions)
    assert saved_ckpt < 0.25 * saved_plain, (saved_ckpt, saved_plain)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=0, atol=0)


def test_activation_checkpointing_of_an_unknown_module_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"perf.activation_checkpointing names 'vision', which is no module of "
                                          r"this model; choose from \['language', 'images'\]"):
        tiny_config(tmp_path, '--perf.activation_checkpointing=["vision"]')


def test_an_unknown_compile_backend_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="perf.compile_backend = 'cudagraphs'; choose one of 'inductor', "
                                          "'aot_eager', 'eager'"):
        tiny_config(tmp_path, "--perf.compile_backend=cudagraphs")
