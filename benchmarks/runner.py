"""One mimo training setup on a preset, with each optimisation behind a switch so it can be measured alone.

All switches on is the fast path; `Options(precision="fp32", compile=False, chunked_ce=False,
text_rows_only=False)` is plain mimo in fp32 through `MimoModel.forward`, the reference of the loss check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed import ProcessGroup

from benchmarks import trace_gaps
from benchmarks.workload import MODALITY, Batch, model_config
from mimo.hf.build import build_model
from mimo.perf.fused_qkv import fuse_qkv
from mimo.perf.linear_ce import CHUNK_KERNELS, linear_cross_entropy
from mimo.perf.master_adamw import MasterAdamW
from mimo.perf.regional import SDPA_BACKENDS, checkpoint_blocks, compile_blocks, use_sdpa_backend

PRECISIONS = ("bf16", "autocast", "fp32")
VIT_COMPILE = ("blocks", "whole", "graphs")
LM_COMPILE = ("blocks", "graphs")
CE_KERNELS = ("auto", *CHUNK_KERNELS)


PLAIN = "compile=0,chunked_ce=0,text_rows_only=0,fuse_qkv=0"
"""Options of plain mimo (the model's own forward and loss, nothing fused): with a precision, the oracle that
the fast path is checked against."""
WARMUP_STEPS = 2  # eager steps before a step_graph capture: compilation, autotuning, lazy initialisation


def captures_step(opts: Options, device_type: str, data_parallel: bool) -> bool:
    """Whether a Run captures its whole step as one CUDA graph (step_graph, with compile, on CUDA); refuses
    what cannot go with it, before anything is built."""
    if not (opts.step_graph and opts.compile and device_type == "cuda"):
        return False
    if data_parallel:
        raise ValueError("step_graph=1 does not capture the collectives of data parallelism (--nproc > 1): "
                         "use step_graph=0")
    if "graphs" in (opts.vit_compile, opts.lm_compile):
        raise ValueError(f"step_graph=1 captures the whole step, so the regions cannot be CUDA graphs of their own: "
                         f"got vit_compile={opts.vit_compile}, lm_compile={opts.lm_compile}; use whole/blocks, or "
                         f"step_graph=0")
    return True


def _no_mark(phase: str) -> None:
    """Default of `Run.step`'s phase marker: no marking."""


@dataclass
class Options:
    """precision: "bf16" = bf16 weights + fp32 master weights and moments (MasterAdamW); "autocast" = fp32
    weights under bf16 autocast + torch's fused AdamW (the baseline's contract); "fp32" = no bf16 at all.
    compile: per-block torch.compile, plus the compiled AdamW update (and loss chunk, see ce_kernel).
    chunked_ce: head + cross-entropy over row chunks (else mimo's plain path with full fp32 logits).
    text_rows_only: run head + loss on the rows that have a label only (with chunked_ce).
    last_layer_rows (with text_rows_only): the last decoder layer's output projection and MLP, and the final
    norm, also on those rows only (its keys and values still cover every position).
    ce_kernel (with chunked_ce and compile; eager chunks otherwise): how each loss chunk runs, "triton" (one
    hand-written kernel), "compiled" (torch.compile) or "auto" (triton on a GPU, else compiled on a GPU,
    else eager).
    ckpt_layers: activation checkpointing of the first k decoder layers.
    vit_compile (with compile): "blocks" compiles each ViT block, "whole" the ViT as one graph, "graphs"
    the whole ViT replayed as CUDA graphs (its blocks are short enough for launch overhead to show).
    lm_compile (with compile): "blocks" compiles each decoder layer (one graph shared by all), "graphs" also
    replays each as CUDA graphs.
    step_graph (with compile, on CUDA, one process): after WARMUP_STEPS eager steps, the whole training step
    (forward, backward, optimizer) is captured as one CUDA graph and replayed on each batch, copied into
    the graph's input buffers: the GPU never waits for Python. It holds the regions' kernels itself, so
    "graphs" for vit_compile or lm_compile (graphs of their own) cannot go with it.
    sdpa: the only attention backend allowed (on CUDA).
    fresh_grads (precision=bf16): MasterAdamW takes autograd's fresh gradients instead of zeroing its flat
    gradient buffer for autograd to add into.
    lm_update_early (precision=bf16 with fresh_grads; one process): the language model's AdamW update starts
    on a side stream as soon as its last gradient is in, under the vision encoder's backward (MasterAdamW's
    `first`).
    fuse_qkv: each attention's q, k and v from one product over their concatenated weights
    (mimo.perf.fuse_qkv), in the vision encoder and the language model.
    step_priority (with step_graph): the step is captured on a stream of the highest priority, so that the
    early update's side stream (the lowest) takes only the SMs the encoder's backward leaves free; at equal
    priority the encoder's backward waited until every block of the update had started (12.3 ms).
    grad_table (precision=bf16 with fresh_grads, on CUDA, one process): MasterAdamW reads each gradient where
    autograd left it, through a table of addresses (one Triton kernel), instead of copying it into a flat
    buffer.
    lr, weight_decay: AdamW as the baseline builds it (torch defaults apart from lr)."""

    precision: str = "bf16"
    compile: bool = True
    chunked_ce: bool = True
    text_rows_only: bool = True
    last_layer_rows: bool = True
    ce_kernel: str = "auto"
    ckpt_layers: int = 0
    vit_compile: str = "whole"
    lm_compile: str = "blocks"
    step_graph: bool = True
    sdpa: str = "cudnn"
    fresh_grads: bool = True
    lm_update_early: bool = True
    step_priority: bool = True
    fuse_qkv: bool = True
    grad_table: bool = True
    lr: float = 1e-5
    weight_decay: float = 1e-2

    @classmethod
    def parse(cls, spec: str, **defaults) -> Options:
        """`"sdpa=cudnn,ckpt_layers=12"` on top of the defaults; fields and types are checked."""
        opts = cls(**defaults)
        types = {f.name: type(getattr(opts, f.name)) for f in dataclasses.fields(cls)}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            key, _, value = item.partition("=")
            if key not in types:
                raise ValueError(f"unknown option '{key}'; choose from {', '.join(types)}")
            if types[key] is bool:
                if value not in ("0", "1", "true", "false"):
                    raise ValueError(f"option {key} takes 0/1/true/false, got '{value}'")
                setattr(opts, key, value in ("1", "true"))
            else:
                setattr(opts, key, types[key](value))
        if opts.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got '{opts.precision}'")
        if opts.vit_compile not in VIT_COMPILE:
            raise ValueError(f"vit_compile must be one of {VIT_COMPILE}, got '{opts.vit_compile}'")
        if opts.lm_compile not in LM_COMPILE:
            raise ValueError(f"lm_compile must be one of {LM_COMPILE}, got '{opts.lm_compile}'")
        if opts.ce_kernel not in CE_KERNELS:
            raise ValueError(f"ce_kernel must be one of {CE_KERNELS}, got '{opts.ce_kernel}'")
        if opts.sdpa not in SDPA_BACKENDS:
            raise ValueError(f"sdpa must be one of {SDPA_BACKENDS}, got '{opts.sdpa}'")
        return opts


class Run:
    """A model, its optimizer and a training step, built as `opts` says. `state` loads given weights
    (so that several runs start from the same ones). With `group`, data parallelism: every rank builds
    the same model from `seed`, and MasterAdamW (sharded over the group) steps on the mean of the ranks'
    gradients."""

    def __init__(self, p: dict, opts: Options, device: torch.device, seed: int = 0,
                 state: dict[str, torch.Tensor] | None = None, group: ProcessGroup | None = None):
        if group is not None and opts.precision != "bf16":
            raise ValueError(f"data parallelism (--nproc > 1) runs MasterAdamW sharded over the ranks, which needs "
                             f"precision=bf16; got precision={opts.precision}: use --nproc 1 for it")
        if opts.lm_update_early and group is not None:
            raise ValueError("lm_update_early=1 updates the language model inside backward, but data parallelism "
                             "reduces every gradient in the optimizer step (--nproc > 1): use lm_update_early=0")
        if opts.grad_table and group is not None:
            raise ValueError("grad_table=1 leaves the gradients where autograd made them, but data parallelism "
                             "reduce-scatters one flat gradient buffer (--nproc > 1): use grad_table=0")
        self.opts, self.device = opts, device
        self.graphed = captures_step(opts, device.type, data_parallel=group is not None)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0
        if self.graphed:  # lower numbers are higher priorities; out-of-range ones are clamped to the highest
            self.capture_stream = torch.cuda.Stream(device, priority=-100 if opts.step_priority else 0)
        if device.type == "cuda":
            use_sdpa_backend(opts.sdpa)
            torch.backends.cudnn.allow_tf32 = opts.precision != "fp32"
        torch.manual_seed(seed)
        with torch.device(device):
            self.model = build_model(model_config(p))
        if state is not None:
            self.model.load_state_dict(state)
        self.model.train()
        if opts.fuse_qkv:
            fuse_qkv(self.model)
        lm = self.model.language_model
        vit = self.model.modality_submodules[MODALITY].encoders["vit"]
        checkpoint_blocks(list(lm.layers.values())[:opts.ckpt_layers])
        if opts.compile:
            if opts.vit_compile == "blocks":
                compile_blocks(vit.layers.values())
            else:
                vit.compile(mode="reduce-overhead" if opts.vit_compile == "graphs" else None)
            compile_blocks(lm.layers.values(), mode="reduce-overhead" if opts.lm_compile == "graphs" else None)
        if opts.precision == "bf16":
            self.opt = MasterAdamW(self.model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay,
                                   compile=opts.compile, group=group, fresh_grads=opts.fresh_grads,
                                   first=lm.parameters() if opts.lm_update_early and opts.fresh_grads else (),
                                   grad_table=opts.grad_table and opts.fresh_grads and device.type == "cuda")
        else:
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay,
                                         fused=device.type == "cuda", capturable=self.graphed)
        self.compute_dtype = torch.float32 if opts.precision == "fp32" else torch.bfloat16

    def autocast(self):
        if self.opts.precision == "autocast":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def loss(self, batch: Batch, mark: Callable[[str], None] = _no_mark) -> torch.Tensor:
        """Mean next-token loss over the text positions (forward only). `mark(phase)` is called as each
        phase's work has been issued (profiling)."""
        model, lm = self.model, self.model.language_model
        with self.autocast():
            if not self.opts.chunked_ce:
                out = model(batch.input_ids, batch.position_ids, labels=batch.labels,
                            modality_inputs=batch.modality_inputs(), modality_token_indices=batch.token_indices)
                return out.loss_sum / out.num_tokens
            embeds = model.combined_embeddings(batch.input_ids, batch.modality_inputs(), batch.token_indices)
            mark("forward: vision + projector + embeddings")
            if mark is not _no_mark and embeds.requires_grad:
                embeds.register_hook(lambda _: mark("backward: language model"))
            if self.opts.text_rows_only and self.opts.last_layer_rows:
                hidden = lm(embeds, batch.position_ids, output_rows=batch.loss_rows)
            else:
                hidden = lm(embeds, batch.position_ids).flatten(0, 1)
                if self.opts.text_rows_only:
                    hidden = hidden.index_select(0, batch.loss_rows)
            mark("forward: language model")
            labels = batch.labels.reshape(-1)
            if self.opts.text_rows_only:
                labels = labels.index_select(0, batch.loss_rows)
            loss_sum, count = linear_cross_entropy(hidden.to(self.compute_dtype),
                                                   lm.output_weight().to(self.compute_dtype), labels,
                                                   kernel=self.opts.ce_kernel if self.opts.compile else "torch")
            loss = loss_sum / count
            mark("forward + gradients: head and loss")
            return loss

    def step(self, batch: Batch, mark: Callable[[str], None] = _no_mark) -> torch.Tensor:
        """One training step on `batch`; its loss. With step_graph, the first WARMUP_STEPS run eagerly (they
        compile), the next one captures the step and every one from there replays it."""
        if not self.graphed:
            return self.eager_step(batch, mark)
        if self.graph is None and self.eager_steps < WARMUP_STEPS:
            self.eager_steps += 1
            self.capture_stream.wait_stream(torch.cuda.current_stream())  # warm up off the default stream,
            with torch.cuda.stream(self.capture_stream):  # as CUDA graph capture wants
                loss = self.eager_step(batch, mark)
            torch.cuda.current_stream().wait_stream(self.capture_stream)
            return loss
        if self.graph is None:
            self.capture(batch)
        else:
            self.static_batch.copy_(batch)
        self.graph.replay()
        mark("whole step (one CUDA graph)")
        return self.static_loss.clone()

    def eager_step(self, batch: Batch, mark: Callable[[str], None] = _no_mark) -> torch.Tensor:
        if self.opts.compile and "graphs" in (self.opts.vit_compile, self.opts.lm_compile):
            torch.compiler.cudagraph_mark_step_begin()
        loss = self.loss(batch, mark)
        loss.backward()
        mark("backward: embeddings + projector + vision")
        self.opt.step()
        self.opt.zero_grad()
        mark("optimizer")
        return loss.detach()

    def capture(self, batch: Batch) -> None:
        """Record one whole step on a copy of `batch` (the graph's input buffers from here on). The warm-up
        steps' cached memory is released first: the graph allocates from a pool of its own."""
        self.static_batch = batch.clone()  # the warm-up steps ended with zero_grad(): autograd hands fresh grads
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.graph = torch.cuda.CUDAGraph()
        # "thread_local": CUDA checks only this thread's calls for capture safety, not those of autograd's
        # backward thread (the mode every measurement ran in); a sync on the captured stream fails in any mode
        # every kernel node keeps the priority of the stream it was captured on (PyTorch instantiates graphs
        # with cudaGraphInstantiateFlagUseNodePriority)
        with torch.cuda.graph(self.graph, stream=self.capture_stream, capture_error_mode="thread_local"):
            self.static_loss = self.eager_step(self.static_batch)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def measure(self, batches: list[Batch], warmup: int, steps: int) -> dict:
        """Time steps as the baseline does (synchronise around each step, median after warm-up); also the
        host's time to issue a step, which shows whether the GPU ever waits for Python."""
        times, issue, first = [], [], 0.0
        for i in range(warmup + steps):
            self.sync()
            t0 = time.perf_counter()
            loss = self.step(batches[i % len(batches)])
            t1 = time.perf_counter()
            self.sync()
            t2 = time.perf_counter()
            if i == 0:
                first = t2 - t0
            if i >= warmup:
                times.append(t2 - t0)
                issue.append(t1 - t0)
        return {"step_s_median": statistics.median(times), "issue_s_median": statistics.median(issue),
                "first_step_s": first, "final_loss": float(loss)}

    def profile(self, batch: Batch, trace: Path, rows: int = 30) -> str:
        """The kernels of one step, most device time first, and (on CUDA) each phase's busy and idle
        device time: where the time goes. The Chrome trace is written to `trace`."""
        cuda = self.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        phases: list[str] = []

        def mark(phase: str) -> None:
            phases.append(phase)
            if cuda:
                torch.cuda._sleep(1)  # a marker kernel (`spin_kernel`) that ends the phase on the device timeline

        with torch.profiler.profile(activities=activities) as prof:
            self.step(batch, mark)
            self.sync()
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        text = prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70)
        prof.export_chrome_trace(str(trace))
        if cuda:
            text += "\n\n" + trace_gaps.report(trace, phases)
        return text

    def host_syncs(self, batch: Batch) -> str:
        """"none" when one more step runs with CUDA's sync debug mode set to error; else the phase that
        waited and the error's first line."""
        if self.device.type != "cuda":
            return "not checked (no CUDA)"
        if self.graphed:
            return "none (the step is one CUDA graph: a sync on its stream would have failed the capture)"
        state = {}
        phases = (("forward", lambda: state.update(loss=self.loss(batch))),
                  ("backward", lambda: state["loss"].backward()),
                  ("optimizer", lambda: (self.opt.step(), self.opt.zero_grad())))
        for name, fn in phases:
            torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
            except RuntimeError as e:
                return f"{name}: {str(e).splitlines()[0][:200]}"
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return "none"
