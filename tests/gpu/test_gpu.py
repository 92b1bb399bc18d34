"""The GPU fast path on a CUDA device: compiled blocks replayed as CUDA graphs, bf16 weights with fp32
master AdamW, the chunked head + loss (compiled or Triton) and the flash kernel with grouped KV heads,
each against an independent fp32 computation; `mimo train` in bf16 with activation checkpointing and an
fp32 encoder against its plain bf16 run. Marked `gpu`: skipped (never passed) where there is no CUDA device.

    python3 -m pytest -q tests/gpu/test_gpu.py      # on the GPU machine
"""

import os

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.runner import PLAIN, Options, Run
from benchmarks.workload import load_preset, make_batches
from mimo.models.layers import attention
from mimo.models.loss import IGNORE_INDEX
from mimo.perf.linear_ce import linear_cross_entropy
from mimo.perf.master_adamw import MasterAdamW
from tests.support.tiny_run import train_losses

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _sdpa_backends_restored():
    """A benchmark `Run` allows only its own attention backend, process-wide (`use_sdpa_backend`), and sets
    cuDNN's TF32 switch; left so, the tests after it in this process would have cuDNN attention alone, which
    takes no fp32 input."""
    flags = ("flash", "cudnn", "mem_efficient", "math")
    enabled = {f: getattr(torch.backends.cuda, f"{f}_sdp_enabled")() for f in flags}
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    tf32 = torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32 = tf32
    for f, on in enabled.items():
        getattr(torch.backends.cuda, f"enable_{f}_sdp")(on)
    if cache is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("kernel", ["compiled", "triton"])
def test_chunked_head_and_loss_match_fp32_full_logits(kernel):
    torch.manual_seed(0)
    hidden = torch.randn(3000, 256, device=CUDA)
    weight = torch.randn(5000, 256, device=CUDA) * 0.05
    labels = torch.randint(0, 5000, (3000,), device=CUDA)
    labels[::7] = IGNORE_INDEX
    h32, w32 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = F.cross_entropy(h32 @ w32.t(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    ref.backward()
    hb, wb = hidden.bfloat16().requires_grad_(), weight.bfloat16().requires_grad_()
    loss, count = linear_cross_entropy(hb, wb, labels, chunk_rows=1024, kernel=kernel)
    loss.backward()
    assert count == (labels != IGNORE_INDEX).sum()
    assert abs(float(loss.detach()) - float(ref.detach())) <= 5e-3 * float(ref.detach())
    assert rel(hb.grad, h32.grad) < 2e-2 and rel(wb.grad, w32.grad) < 2e-2


@pytest.mark.parametrize("grad_table", [False, True])
def test_compiled_master_adamw_matches_torch_adamw(grad_table):
    """The same gradients into both (forward kernels may differ with memory alignment, and Adam turns
    such rounding on near-zero gradients into whole steps): the update alone is compared, compiled over the
    flat gradient buffer or the Triton kernel reading the gradients through their addresses."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(300, 200, device=CUDA)
    fast = torch.nn.Linear(300, 200, device=CUDA)
    fast.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, weight_decay=0.1, dtype=torch.float32, compile=True,
                      grad_table=grad_table)
    for _ in range(5):
        for a, b in zip(ref.parameters(), fast.parameters()):
            g = torch.randn_like(a)
            a.grad = g.clone()
            b.grad = g.clone()
        opt_ref.step()
        opt.step()
        opt.zero_grad()
    for a, b in zip(ref.parameters(), fast.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_flash_attention_with_grouped_kv_heads_matches_repeated_heads_in_fp32():
    torch.manual_seed(0)
    q = torch.randn(2, 8, 256, 64, device=CUDA)
    k, v = torch.randn(2, 2, 256, 64, device=CUDA), torch.randn(2, 2, 256, 64, device=CUDA)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # flash only: an input it cannot take fails
        out = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True)
    assert rel(out, ref) < 1e-2


@pytest.mark.parametrize("extra", ["", ",lm_update_early=0", ",grad_table=0"])
def test_benchmarked_fast_path_trains_like_fp32_mimo(extra):
    """Preset tiny, all optimisations on (the whole step captured as one CUDA graph over compiled regions,
    cuDNN attention, bf16 + master AdamW, the chunked loss on text rows with the Triton chunk where Triton
    runs) against plain fp32 mimo from the same weights: each of 8 losses within 1% (steps 1-2 eager, 3
    captured and replayed, 4-8 replayed on alternating batches)."""
    p = load_preset("tiny")
    ref = Run(p, Options.parse(f"precision=fp32,{PLAIN},sdpa=math,lr=1e-3"), CUDA)
    state = {k: v.detach().clone() for k, v in ref.model.state_dict().items()}
    batches = make_batches(p, CUDA)
    ref_losses = [float(ref.step(batches[i % 2])) for i in range(8)]
    fast = Run(p, Options.parse("lr=1e-3" + extra), CUDA, state=state)  # allows only the cuDNN kernel from here on
    o = fast.opts
    assert o.compile and o.step_graph and o.sdpa == "cudnn" and o.ce_kernel == "auto"
    fast_losses = [float(fast.step(batches[i % 2])) for i in range(8)]
    assert fast.graph is not None
    assert ref_losses[-1] < ref_losses[0] - 0.1
    for i, (a, b) in enumerate(zip(ref_losses, fast_losses)):
        assert abs(a - b) <= 1e-2 * a, (i, a, b)


@pytest.mark.parametrize("extra", ["", ",lm_update_early=0", ",grad_table=0"])
def test_captured_step_replays_the_eager_step(extra):
    """The step graph (by default with the language model's update started on a side stream in backward, and
    the gradients read through a table of their addresses) against the same compiled regions stepped eagerly
    with the whole update after backward over a flat gradient buffer, from the same weights on the
    same alternating batches: losses agree to 1e-3 and the weights' change over the 7 steps to 5e-2, so replaying
    on new inputs (copied into the graph's buffers) trains as eager steps do. The key biases are left out:
    their true gradient is zero (softmax ignores a shift shared by all keys), cuDNN's attention backward
    accumulates in nondeterministic order, and Adam turns that rounding noise into whole steps, which
    differ between any two runs, eager or not."""
    p = load_preset("tiny")
    batches = make_batches(p, CUDA)
    eager = Run(p, Options.parse("step_graph=0,lm_update_early=0,grad_table=0,lr=1e-3"), CUDA)
    state = {k: v.detach().clone() for k, v in eager.model.state_dict().items()}
    graphed = Run(p, Options.parse("lr=1e-3" + extra), CUDA, state=state)
    eager_losses = [float(eager.step(batches[i % 2])) for i in range(7)]
    graphed_losses = [float(graphed.step(batches[i % 2])) for i in range(7)]
    assert graphed.graph is not None and eager.graph is None
    for i, (a, b) in enumerate(zip(eager_losses, graphed_losses)):
        assert abs(a - b) <= 1e-3 * a, (i, a, b)
    start = {k: v.float() for k, v in state.items()}
    change = [torch.cat([(p.detach().float() - start[n]).reshape(-1) for n, p in run.model.named_parameters()
                         if not n.endswith("k_proj.bias")]) for run in (eager, graphed)]
    assert rel(change[1], change[0]) < 5e-2


def _trainer_losses(out, *switches: str) -> list[float]:
    return train_losses(out, "--train.device=cuda", "--train.dtype=bfloat16", "--train.steps=6",
                        "--data.global_batch=16", *switches)


def test_mimo_train_on_a_gpu_with_checkpointing_and_an_fp32_encoder(tmp_path):
    """`mimo train`'s bf16 autocast on CUDA, with activation checkpointing of both modules (the same kernels
    again in the backward) and with the encoder kept in fp32 (nested autocast): the loss curves stay
    within bf16 distance of the plain bf16 run's."""
    plain = _trainer_losses(tmp_path / "plain")
    ckpt = _trainer_losses(tmp_path / "ckpt", '--train.activation_checkpointing=["language", "images"]')
    fp32_encoder = _trainer_losses(tmp_path / "fp32_encoder", "--train.module_dtype.images=float32")
    assert len(plain) == len(ckpt) == len(fp32_encoder) == 6
    for other in (ckpt, fp32_encoder):
        for a, b in zip(other, plain):
            assert abs(a - b) <= 2e-2 * abs(b), (other, plain)
