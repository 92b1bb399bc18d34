"""The GPU benchmark's pieces on the CPU: the fast path computes what plain mimo computes, and the whole
benchmark (mimo and, where transformers is installed, the Hugging Face baseline) runs on preset `tiny`."""

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from benchmarks import trace_gaps
from benchmarks.runner import PLAIN, Options, Run, captures_step
from benchmarks.workload import BASELINE_DIR, baseline_module, load_preset, make_batches, train_flops_per_sample
from mimo.models.layers import rope_cos_sin
from mimo.models.llm import DecoderLayer
from mimo.models.loss import IGNORE_INDEX, cross_entropy_sum
from mimo.perf.linear_ce import linear_cross_entropy
from mimo.perf.master_adamw import MasterAdamW
from mimo.perf.regional import checkpoint_blocks, use_sdpa_backend
from tests.support.configs import tiny_llm

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "bench"


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is not on this machine; nothing to compare the copy with")
def test_baseline_copies_are_byte_identical():
    for name in ("hf_vlm_baseline.py", "presets.json"):
        assert (BASELINE_DIR / name).read_bytes() == (SHARED / name).read_bytes(), name


def test_flops_formula_is_the_baselines():
    assert train_flops_per_sample is not None
    p = load_preset("small")
    assert train_flops_per_sample(p) == baseline_module().train_flops_per_sample(p)
    assert round(train_flops_per_sample(p) * p["micro_batch"] / 1e12, 2) == 169.67


def test_batches_match_the_baselines_data():
    p = load_preset("tiny")
    gen = torch.Generator().manual_seed(1)
    pixels, ids, labels = baseline_module().make_batch(p, p["llm"]["vocab"] - 1, "cpu", gen)
    b = make_batches(p, torch.device("cpu"), count=1)[0]
    assert torch.equal(b.pixels, pixels) and torch.equal(b.input_ids, ids)
    # HF shifts inside the loss; mimo's labels are already aligned with the predicting position.
    assert torch.equal(b.labels[:, :-1], labels[:, 1:]) and (b.labels[:, -1] == IGNORE_INDEX).all()
    assert torch.equal(b.loss_rows, (b.labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1))


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


def _step_both(*optimizers) -> None:
    """One step of each optimizer, then its gradients cleared."""
    for opt in optimizers:
        opt.step()
        opt.zero_grad()


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
        _step_both(opt_ref, opt)
    for a, b in zip(ref.parameters(), fast.parameters()):
        torch.testing.assert_close(a, b)


def _three_layer_twins(inputs: int = 8) -> tuple[torch.nn.Sequential, torch.nn.Sequential]:
    """Two copies of one seeded inputs-5-3-2 stack of linears: torch's AdamW trains one, MasterAdamW the other."""
    torch.manual_seed(0)

    def layers() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(inputs, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))

    ref, fast = layers(), layers()
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def check_accumulated_hand_set_and_missing_gradients(inputs: int = 8, atol: float = 1e-5, **opt_kwargs) -> None:
    """Two backward passes before a step add up; a gradient assigned by hand counts (also a strided one, and
    one that starts off alignment in its storage); a parameter that had a gradient in the first step and
    none after steps on zeros (weight decay and moments still move), as torch's AdamW does with zeros: its
    view in the flat buffer must not keep the first step's values. Also run in Triton's interpreter with
    grad_table (tests/unit/test_adamw_triton.py)."""
    ref, fast = _three_layer_twins(inputs)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, weight_decay=0.1, dtype=torch.float32, **opt_kwargs)
    for step in range(3):
        for _micro in range(2):  # micro-batches: the second backward adds into the first's gradients
            x = torch.randn(6, inputs)
            for model in (ref, fast):
                h = model[1](model[0](x))
                (model[2](h) if step == 0 else h).square().sum().backward()  # model[2]: first step only
        hand, shifted = torch.randn(5, 3), torch.randn(4)
        ref[1].weight.grad, fast[1].weight.grad = hand.t().contiguous(), hand.clone().t()
        ref[1].bias.grad, fast[1].bias.grad = shifted[1:].clone(), shifted.clone()[1:]
        if step > 0:
            for p in ref[2].parameters():
                p.grad = torch.zeros_like(p)
        _step_both(opt_ref, opt)
        assert all((p.grad is None) == opt.fresh_grads for p in fast.parameters())
    for a, b in zip(ref.parameters(), fast.parameters()):
        torch.testing.assert_close(b, a, rtol=1.3e-6, atol=atol)


@pytest.mark.parametrize("fresh_grads", [True, False])
def test_master_adamw_takes_accumulated_hand_set_and_missing_gradients_like_torch_adamw(fresh_grads):
    check_accumulated_hand_set_and_missing_gradients(chunk=16, fresh_grads=fresh_grads)


def check_first_parameters_updated_in_backward(inputs: int = 8, atol: float = 1e-5, **opt_kwargs) -> None:
    """The last two layers' gradients are complete before the first layer's: their update starts in the hook
    of the last of them (inside backward) and the result is torch's AdamW after backward. In the step where
    layer 2 is not used, the group never completes and step() updates it (layer 2 on zeros). Also run in
    Triton's interpreter with grad_table (tests/unit/test_adamw_triton.py)."""
    ref, fast = _three_layer_twins(inputs)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, weight_decay=0.1, dtype=torch.float32,
                      first=[*fast[1].parameters(), *fast[2].parameters()], **opt_kwargs)
    assert opt.params[0] is fast[1].weight  # the first parameters lead the flat buffers
    for step in range(3):
        x = torch.randn(6, inputs)
        for model in (ref, fast):
            h = model[1](model[0](x))
            (model[2](h) if step != 1 else h).square().sum().backward()
        if step == 1:
            for p in ref[2].parameters():
                p.grad = torch.zeros_like(p)
        assert opt.launched == (step != 1)
        _step_both(opt_ref, opt)
        for a, b in zip(ref.parameters(), fast.parameters()):
            torch.testing.assert_close(b, a, rtol=1.3e-6, atol=atol)


@pytest.mark.parametrize("compile", [False, True])
def test_master_adamw_updates_the_first_parameters_in_backward_like_torch_adamw(compile):
    check_first_parameters_updated_in_backward(compile=compile)


def test_master_adamw_first_refuses_what_it_cannot_do():
    lin = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="fresh_grads=True"):
        MasterAdamW(lin.parameters(), dtype=torch.float32, fresh_grads=False, first=lin.parameters())
    with pytest.raises(ValueError, match="not among those it updates"):
        MasterAdamW([lin.weight], dtype=torch.float32, first=lin.parameters())
    MasterAdamW(lin.parameters(), dtype=torch.float32, first=lin.parameters())
    lin(torch.randn(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="one backward per step"):
        lin(torch.randn(3, 4)).sum().backward()
    lin = torch.nn.Linear(4, 2)
    opt = MasterAdamW(lin.parameters(), dtype=torch.float32, first=[lin.weight])
    lin(torch.randn(3, 4)).sum().backward()
    lin.weight.grad = torch.ones_like(lin.weight)
    with pytest.raises(RuntimeError, match="set by hand"):
        opt.step()


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


@pytest.mark.parametrize("extra", ["", ",lm_update_early=0"])
def test_fast_path_follows_fp32_mimo_on_tiny(extra):
    """bf16 weights + master AdamW + chunked loss on text rows vs plain fp32 MimoModel.forward."""
    p, cpu = load_preset("tiny"), torch.device("cpu")
    batches = make_batches(p, cpu)
    ref = Run(p, Options.parse(f"precision=fp32,{PLAIN},lr=1e-3"), cpu)
    fast = Run(p, Options.parse("compile=0,lr=1e-3" + extra), cpu, state=ref.model.state_dict())
    for i in range(4):
        a, b = float(ref.step(batches[i % 2])), float(fast.step(batches[i % 2]))
        assert abs(a - b) <= 1e-2 * a, (i, a, b)


def test_batches_copy_into_a_captured_steps_buffers_and_refuse_other_shapes():
    """A captured step reads its inputs from fixed tensors: a new batch is copied into them in place, and one
    of another shape is refused, naming the tensor, before anything is copied."""
    p, cpu = load_preset("tiny"), torch.device("cpu")
    first, second = make_batches(p, cpu)
    static = first.clone()
    pointers = {k: t.data_ptr() for k, t in static.tensors().items()}
    static.copy_(second)
    for name, t in static.tensors().items():
        assert t.data_ptr() == pointers[name] and torch.equal(t, second.tensors()[name]), name
    wider = make_batches({**p, "micro_batch": p["micro_batch"] + 1}, cpu, count=1)[0]
    with pytest.raises(ValueError, match=r"batch\.pixels has shape \(3, .*step_graph=0"):
        static.copy_(wider)
    fewer_rows = first.clone()
    fewer_rows.loss_rows = fewer_rows.loss_rows[:-1]  # only the last tensor differs in shape
    with pytest.raises(ValueError, match=r"batch\.loss_rows has shape"):
        static.copy_(fewer_rows)
    for name, t in static.tensors().items():
        assert torch.equal(t, second.tensors()[name]), name


def test_step_graph_is_refused_where_it_cannot_run_and_skipped_where_it_does_not_apply():
    """Checked before anything is built: a captured step with data parallelism or with regions that are CUDA
    graphs of their own is an error naming the fix; off CUDA or without compile there is nothing to capture."""
    opts = Options.parse("")
    assert captures_step(opts, "cuda", data_parallel=False)
    assert not captures_step(opts, "cpu", data_parallel=False)
    assert not captures_step(Options.parse("compile=0"), "cuda", data_parallel=True)
    with pytest.raises(ValueError, match="step_graph=0"):
        captures_step(opts, "cuda", data_parallel=True)
    with pytest.raises(ValueError, match="lm_compile=graphs.*step_graph=0"):
        captures_step(Options.parse("lm_compile=graphs"), "cuda", data_parallel=False)


def test_early_update_and_gradient_table_are_refused_with_data_parallelism():
    """Checked before the model is built (the group is never used): data parallelism reduces one flat
    gradient buffer in the optimizer step, so the language model cannot be updated inside backward, nor
    the gradients left where autograd made them."""
    with pytest.raises(ValueError, match="lm_update_early=0"):
        Run(load_preset("tiny"), Options.parse("compile=0"), torch.device("cpu"), group=object())
    with pytest.raises(ValueError, match="grad_table=0"):
        Run(load_preset("tiny"), Options.parse("compile=0,lm_update_early=0"), torch.device("cpu"), group=object())


def test_options_are_checked():
    assert Options.parse("sdpa=flash,ckpt_layers=3,compile=0") == Options(sdpa="flash", ckpt_layers=3, compile=False)
    for bad in ("nope=1", "compile=maybe", "precision=fp8", "ce_kernel=fused", "sdpa=fa9", "lm_compile=whole"):
        key = bad.partition("=")[0]
        with pytest.raises(ValueError, match=key):
            Options.parse(bad)


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


def test_benchmark_runs_on_tiny(tmp_path):
    """The full command on the CPU. With transformers installed the baseline runs too and gets a ratio;
    without it the baseline row must say that it failed (mimo's side is still measured)."""
    cmd = [sys.executable, "-m", "benchmarks.bench_vlm", "--preset", "tiny", "--steps", "2", "--warmup", "1",
           "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {row["label"]: row for row in map(json.loads, (tmp_path / "tiny.jsonl").read_text().splitlines())}
    assert set(rows) == {"mimo", "hf eager"}
    assert rows["mimo"]["tokens_per_s"] > 0 and rows["mimo"]["options"]["compile"] is False
    assert rows["mimo"]["options"]["step_graph"] is False  # asked for, but there is no CUDA graph on a CPU
    table = (tmp_path / "tiny.md").read_text()
    assert "| mimo |" in table and table in r.stdout
    if importlib.util.find_spec("transformers") is not None:
        assert rows["hf eager"]["tokens_per_s"] > 0 and "x hf eager" in table
    else:
        assert "error" in rows["hf eager"]


def test_benchmark_runs_data_parallel_on_tiny(tmp_path):
    """mimo on 2 gloo ranks through torchrun: one row, whose throughput is over both ranks."""
    cmd = [sys.executable, "-m", "benchmarks.bench_vlm", "--preset", "tiny", "--nproc", "2", "--no-baseline",
           "--steps", "2", "--warmup", "1", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    [row] = map(json.loads, (tmp_path / "tiny.jsonl").read_text().splitlines())
    assert row["label"] == "mimo on 2 GPUs" and row["gpus"] == 2, row
    assert row["options"]["step_graph"] is False and row["options"]["lm_compile"] == "graphs", row["options"]
    assert row["tokens_per_s_per_gpu"] > 0 and math.isfinite(row["final_loss"]), row
    assert "| mimo on 2 GPUs | 2 |" in (tmp_path / "tiny.md").read_text()


def test_a_scaling_table_runs_every_row_without_the_step_graph():
    """The captured step leaves data parallelism's collectives out, so once any row is data-parallel every
    row (the one-GPU row included) replays its regions as CUDA graphs instead: the rows run the same step."""
    from benchmarks.bench_vlm import mimo_cmd

    def args(nproc):
        return argparse.Namespace(preset="tiny", steps=1, warmup=1, peak_tflops=1.0, profile=False, trace_dir=None,
                                  out="x", nproc=nproc)
    assert "--region-graphs" not in mimo_cmd(args(None), "", 1)
    assert "--region-graphs" not in mimo_cmd(args([1]), "", 1)
    one_gpu_row = mimo_cmd(args([1, 2]), "", 1)
    assert "--region-graphs" in one_gpu_row and "--region-graphs" in mimo_cmd(args([1, 2]), "", 2)
    r = subprocess.run(one_gpu_row, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    options = json.loads(r.stdout.strip().splitlines()[-1])["options"]
    assert options["step_graph"] is False and options["vit_compile"] == options["lm_compile"] == "graphs", options


def test_trace_gaps_split_phases_at_markers():
    def ev(ts, dur, name):
        return {"cat": "kernel", "ts": ts, "dur": dur, "name": name}

    # phase a: kernels 0-10 and 15-20 (two streams overlapping 8-10 with 5-10), marker at 25-26;
    # phase b: one kernel 30-40, marker at 50-51. CPU ops are ignored.
    trace = {"traceEvents": [ev(0, 10, "k1"), ev(5, 5, "k2"), ev(15, 5, "k3"), ev(25, 1, "void spin_kernel(long)"),
                             ev(30, 10, "k4"), ev(50, 1, "spin_kernel"), {"cat": "cpu_op", "ts": 0, "dur": 99}]}
    events = trace_gaps.device_events(trace)
    rows = trace_gaps.phase_table(events, ["a", "b"])
    assert [(r["kernels"], r["wall_ms"] * 1e3, r["busy_ms"] * 1e3, r["idle_ms"] * 1e3) for r in rows] == \
        [(3, 25.0, 15.0, 10.0), (1, 24.0, 10.0, 14.0)]
    # gaps: 10-15 (k2 ends last at 10), 20-25, 26-30, 40-50
    assert trace_gaps.largest_gaps(events, 10) == [(0.01, "k4", "spin_kernel"), (0.005, "k3", "void spin_kernel(long)"),
                                                   (0.005, "k2", "k3"), (0.004, "void spin_kernel(long)", "k4")]
    with pytest.raises(ValueError, match="2 marker kernels in the trace but 1 phase names"):
        trace_gaps.phase_table(events, ["a"])


def test_step_time_splits_into_compute_exposed_communication_and_idle():
    # compute 0-10 and 20-30; NCCL 5-25 (hidden behind compute 5-10 and 20-25, exposed 10-20); idle 30-40
    events = [(0.0, 10e3, "gemm"), (5e3, 25e3, "ncclDevKernel_AllReduce"), (20e3, 30e3, "gemm"), (40e3, 41e3, "add")]
    split = trace_gaps.compute_and_communication(events)
    assert split == {"span": 41.0, "compute": 21.0, "exposed_comm": 10.0, "idle": 10.0}
    assert trace_gaps.compute_and_communication([])["span"] == 0.0


def test_attention_benchmark_times_kernels_against_fp32_math_on_tiny():
    """CPU: the flash kernel's output and gradients against the math backend's, on both shapes of the
    preset (grouped KV heads in the LM's); a kernel the CPU lacks is a row with its reason."""
    from benchmarks import bench_attention

    rows = bench_attention.main(["--preset", "tiny", "--device", "cpu", "--iters", "2", "--warmup", "1",
                                 "--kernel", "flash", "--kernel", "math", "--kernel", "cudnn"])
    timed = [r for r in rows if "error" not in r]
    assert {(r["shape"], r["kernel"]) for r in timed} == {(s, k) for s in ("lm", "vit") for k in ("flash", "math")}
    for r in timed:
        assert r["forward_ms"] > 0 and r["out_err"] < 1e-5 and r["grad_err"] < 1e-5, r
    assert {r["kernel"] for r in rows if "error" in r} == {"cudnn"}
