"""The GPU fast path on a CUDA device: `mimo train` with every fast path (compiled blocks, bf16 weights with fp32
master AdamW) against fp32 `mimo train`, the chunked head + loss (compiled or Triton) and the flash kernel with
grouped KV heads, each against an independent fp32 computation; `mimo train` in bf16 with activation checkpointing
and an fp32 encoder against its plain bf16 run. Marked `gpu`: skipped (never passed) where there is no CUDA device.

    python3 -m pytest -q tests/gpu/test_gpu.py      # on the GPU machine
"""

import os

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mimo.models.layers import attention
from mimo.models.loss import IGNORE_INDEX
from mimo.perf.linear_ce import linear_cross_entropy
from mimo.perf.master_adamw import MasterAdamW
from mimo.train.trainer import Trainer
from tests.support.tiny_run import tiny_config, train_losses

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _sdpa_backends_restored():
    """`perf.attention_backend` allows only its own attention backend, process-wide (`use_sdpa_backend`), and
    the trainer sets cuDNN's TF32 switch; left so, the tests after it in this process would have cuDNN
    attention alone, which takes no fp32 input."""
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
    flat gradient buffer or the Triton kernel reading the gradients through their addresses. The bias has no
    gradient in step 2: skipped there, it is a step behind the weight after it (each bias-corrected by its own
    count, as torch's AdamW does)."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(300, 200, device=CUDA)
    fast = torch.nn.Linear(300, 200, device=CUDA)
    fast.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, weight_decay=0.1, dtype=torch.float32, compile=True,
                      grad_table=grad_table)
    for step in range(5):
        for a, b in zip(ref.parameters(), fast.parameters()):
            g = torch.randn_like(a)
            a.grad, b.grad = (None, None) if step == 2 and a.dim() == 1 else (g.clone(), g.clone())
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


SYNTHETIC = ["--train.device=cuda", "--perf.gpu_defaults=false", "--data.name=synthetic", "--data.seq_len=64",
             "--data.global_batch=4",
             "--data.repeat_batches=2",
             "--optim.clip=0", "--optim.lr=1e-3", "--train.log_every=1"]
FAST = ["--precision.dtype=bfloat16", "--precision.master_weights=true", "--perf.grad_table=true",
        "--perf.compile=true", "--perf.encoder_compile=whole", "--perf.chunked_loss=true", "--perf.loss_rows_only=true",
        "--perf.fuse_qkv=true", "--perf.attention_backend=cudnn"]


def _step_losses(out, steps: int, *switches: str) -> tuple[list[float], Trainer]:
    trainer = Trainer(tiny_config(out, *SYNTHETIC, f"--train.steps={steps}", *switches))
    return [trainer.train_step(i)["loss"] for i in range(steps)], trainer


@pytest.mark.parametrize("extra", [[], ["--perf.grad_table=false"]])
def test_every_fast_path_of_mimo_train_trains_like_fp32_mimo_train(tmp_path, extra):
    """`mimo train` with every fast path (compiled regions, cuDNN attention, bf16 weights + master AdamW, the
    chunked loss on the labelled rows with the Triton chunk) against plain fp32 `mimo train` from the same seed on
    the same synthetic batches: each of 8 losses within 1%."""
    ref, _ = _step_losses(tmp_path / "ref", 8, "--perf.attention_backend=math")
    fast, trainer = _step_losses(tmp_path / "fast", 8, *FAST, *extra)
    assert ref[-1] < ref[0] - 0.1
    for i, (a, b) in enumerate(zip(ref, fast)):
        assert abs(a - b) <= 1e-2 * a, (i, a, b)


def test_mimo_train_on_a_gpu_defaults_to_the_fast_path(tmp_path):
    """A config naming only train.device = "cuda" trains with the GPU defaults (mimo.perf.gpu_defaults): the
    same losses, to 1e-3, as the same run with those keys set by hand."""
    plain = [k for k in SYNTHETIC if "gpu_defaults" not in k]
    defaults = Trainer(tiny_config(tmp_path / "defaults", *plain, "--train.steps=6"))
    assert defaults.cfg.precision.master_weights and defaults.cfg.perf.compile
    ran = [defaults.train_step(i)["loss"] for i in range(6)]
    by_hand, _ = _step_losses(tmp_path / "by_hand", 6, *FAST)
    for i, (a, b) in enumerate(zip(ran, by_hand)):
        assert abs(a - b) <= 1e-3 * b, (i, a, b)


def _trainer_losses(out, *switches: str) -> list[float]:
    return train_losses(out, "--train.device=cuda", "--perf.gpu_defaults=false", "--precision.dtype=bfloat16",
                        "--train.steps=6", "--data.global_batch=16", *switches)


def test_mimo_train_on_a_gpu_with_checkpointing_and_an_fp32_encoder(tmp_path):
    """`mimo train`'s bf16 autocast on CUDA, with activation checkpointing of both modules (the same kernels
    again in the backward) and with the encoder kept in fp32 (nested autocast): the loss curves stay
    within bf16 distance of the plain bf16 run's."""
    plain = _trainer_losses(tmp_path / "plain")
    ckpt = _trainer_losses(tmp_path / "ckpt", '--perf.activation_checkpointing=["language", "images"]')
    fp32_encoder = _trainer_losses(tmp_path / "fp32_encoder", "--precision.module_dtype.images=float32")
    assert len(plain) == len(ckpt) == len(fp32_encoder) == 6
    for other in (ckpt, fp32_encoder):
        for a, b in zip(other, plain):
            assert abs(a - b) <= 2e-2 * abs(b), (other, plain)
