"""mimo.perf's pieces on the CPU against independent computations: the chunked head + loss against full
logits, MasterAdamW against torch's AdamW (accumulated, hand-set and missing gradients; fp32 masters of
bf16 weights), checkpointed blocks' gradients, and a compile cache folder per
SDPA backend."""

import os

import pytest
import torch
import torch.nn.functional as F

from mimo.models.layers import rope_cos_sin
from mimo.models.llm import DecoderLayer
from mimo.models.loss import IGNORE_INDEX, cross_entropy_sum
from mimo.perf.linear_ce import linear_cross_entropy
from mimo.perf.master_adamw import MasterAdamW
from mimo.perf.regional import checkpoint_blocks, use_sdpa_backend
from tests.support.configs import tiny_llm
from tests.support.master_adamw_checks import (
    check_accumulated_hand_set_and_missing_gradients,
    check_parameters_without_gradients_are_skipped,
    step_both,
)


def test_linear_cross_entropy_matches_full_logits():
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (37,))
    labels[::5] = IGNORE_INDEX
    # float64 throughout (mimo's cross_entropy_sum computes in fp32, too coarse to compare gradients with).
    ref = F.cross_entropy(hidden @ weight.t(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    g_ref = torch.autograd.grad(3.0 * ref, (hidden, weight))
    # one group of all rows; groups of two chunks (8 rows each: 37 rows give groups of 16, 16, 5)
    for group_bytes in (1 << 30, 2 * 8 * 50 * 8):
        loss, count = linear_cross_entropy(hidden, weight, labels, chunk_rows=8, group_bytes=group_bytes)
        assert count == cross_entropy_sum(hidden @ weight.t(), labels)[1] == 29
        torch.testing.assert_close(loss, ref)
        g = torch.autograd.grad(3.0 * loss, (hidden, weight))
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b)


def test_linear_cross_entropy_of_no_rows_is_zero_with_zero_gradients():
    """A context-parallel rank of perf.loss_rows_only may hold no labelled row: 0 loss, 0 tokens, zero gradients."""
    hidden = torch.randn(0, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    loss, count = linear_cross_entropy(hidden, weight, torch.zeros(0, dtype=torch.long))
    assert loss.item() == 0.0 and count.item() == 0.0
    grad_hidden, grad_weight = torch.autograd.grad(loss, (hidden, weight))
    assert grad_hidden.shape == (0, 16) and torch.equal(grad_weight, torch.zeros_like(weight))


def test_master_adamw_matches_torch_adamw():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 3, bias=False))
    fast = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 3, bias=False))
    fast.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1, dtype=torch.float32, chunk=16)
    for _ in range(4):
        x = torch.randn(6, 8)
        ref(x).square().sum().backward()
        fast(x).square().sum().backward()
        step_both(opt_ref, opt)
    for a, b in zip(ref.parameters(), fast.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("fresh_grads", [True, False])
def test_master_adamw_takes_accumulated_hand_set_and_missing_gradients_like_torch_adamw(fresh_grads):
    check_accumulated_hand_set_and_missing_gradients(chunk=16, fresh_grads=fresh_grads)


@pytest.mark.parametrize("fresh_grads", [True, False])
def test_master_adamw_skips_parameters_without_gradients_like_torch_adamw(fresh_grads):
    check_parameters_without_gradients_are_skipped(chunk=16, fresh_grads=fresh_grads)


def test_master_adamw_keeps_fp32_masters_of_bf16_weights():
    lin = torch.nn.Linear(4, 4)
    before = lin.weight.detach().clone()
    opt = MasterAdamW(lin.parameters(), lr=1e-3)
    assert lin.weight.dtype == torch.bfloat16
    torch.testing.assert_close(opt.master[:16].view(4, 4), before, rtol=0, atol=0)
    lin(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    assert lin.weight.grad.dtype == torch.bfloat16
    assert lin.weight.grad.data_ptr() == opt.grad.data_ptr()  # the gradient sits in the flat buffer
    opt.step()
    assert torch.equal(lin.weight, opt.master[:16].view(4, 4).to(torch.bfloat16))


def test_checkpointed_blocks_give_the_same_gradients():
    torch.manual_seed(0)
    cfg = tiny_llm(vocab=32, layers=1, mlp=48)
    plain, ckpt = DecoderLayer(cfg), DecoderLayer(cfg)
    ckpt.load_state_dict(plain.state_dict())
    checkpoint_blocks([ckpt])
    x = torch.randn(2, 6, 32)
    rope = rope_cos_sin(torch.arange(6).expand(2, 6), 8, 10000.0)
    plain(x, rope).square().sum().backward()
    ckpt(x, rope).square().sum().backward()
    for a, b in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_each_sdpa_backend_compiles_into_a_cache_folder_of_its_own(monkeypatch, tmp_path):
    """torch.compile's on-disk caches do not key on the SDPA backend: without a folder per backend, a run
    asking for one backend replays graphs traced with another."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    flags = {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in ("flash", "cudnn", "math")}
    flags["mem_efficient"] = torch.backends.cuda.mem_efficient_sdp_enabled()
    try:
        use_sdpa_backend("math")
        first = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        use_sdpa_backend("flash")
        second = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    finally:
        for name, on in flags.items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)
    assert first == str(tmp_path / "cache" / "sdpa-math")
    assert second == str(tmp_path / "cache" / "sdpa-flash")

