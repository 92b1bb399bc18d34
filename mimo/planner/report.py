"""What `mimo plan` prints: the winner's TOML and a table of every candidate, or (`--json`) every candidate's
figures as one JSON object (the fields are listed in docs/planner.md, "--json")."""

from __future__ import annotations

import dataclasses
import json
import math

from mimo.config.schema import LANGUAGE, Config
from mimo.planner.candidates import KIND, Plan, Row, label, param_count_text, to_toml
from mimo.planner.memory import GIB


def _header(cfg: Config, plan: Plan) -> str:
    seq = plan.sizes[LANGUAGE].tokens_per_sample
    micro = cfg.parallel.microbatches
    model = ", ".join(f"{n} {param_count_text(s.params)} params" for n, s in plan.sizes.items())
    ckpt = cfg.perf.activation_checkpointing
    apart = ", ".join(f"{n} {d}" for n, d in cfg.precision.module_dtype.items())
    nodes = math.ceil(plan.gpus / plan.network.gpus_per_node)
    return (f"{plan.gpus} GPU{'s' if plan.gpus > 1 else ''} of {plan.gpu_memory_gib:g} GiB ({nodes} node"
            f"{'s' if nodes > 1 else ''} of {plan.network.gpus_per_node}); {model}; global batch "
            f"{cfg.data.global_batch} x seq_len {seq}, {micro} microbatch{'es' if micro > 1 else ''}, "
            f"{cfg.precision.dtype}" + (f" ({apart})" if apart else "")
            + (f", activation checkpointing of {', '.join(ckpt)}" if ckpt else ""))


def render(cfg: Config, plan: Plan) -> str:
    """The suggestion as TOML, then the table of every candidate, then the models' assumptions."""
    best = plan.rows[0]
    ckpt = cfg.perf.activation_checkpointing
    out = [_header(cfg, plan), ""]
    if best.fits:
        p = best.prediction
        out.append(f"suggested: {label(best.layout, best.modules)} (predicted {p.step_s:.4g} s per step, "
                   f"{p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {100 * p.mfu:.1f}%; estimated "
                   f"{best.peak_gib:.1f} GiB per GPU) - {best.why}")
    else:
        fixes = "raise parallel.microbatches, shorten data.seq_len, lower data.global_batch or add GPUs."
        if any(n not in ckpt for n in plan.sizes):
            every = json.dumps(list(plan.sizes))
            fixes = f"checkpoint activations (perf.activation_checkpointing = {every}), {fixes}"
        out.append(f"warning: no candidate fits in {plan.gpu_memory_gib:g} GiB; the lowest estimate is "
                   f"{best.peak_gib:.1f} GiB. {fixes[0].upper()}{fixes[1:]}")
    out += ["", to_toml(best.modules, best.microbatches, best.layout)]
    head = ("#", "layout", "kind", "micro", "step s", "MFU", "peak GiB", "states", "acts", "fits", "why")
    table = [head] + [(str(i + 1), label(r.layout, r.modules), KIND[r.klass], str(r.microbatches),
                       f"{r.prediction.step_s:.4g}",
                       f"{100 * r.prediction.mfu:.1f}%", f"{r.peak_gib:.2f}", f"{r.usage.states / GIB:.2f}",
                       f"{r.usage.activations / GIB:.2f}", "yes" if r.fits else "no", r.why)
                      for i, r in enumerate(plan.rows)]
    widths = [max(len(row[c]) for row in table) for c in range(len(head) - 1)]
    for row in table:
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1])
    out += ["", f"Step time (mimo/planner/predict.py) from the profile of {plan.profile.device} and links of "
            f"{plan.network.nvlink_gbps:g} GB/s in a node, {plan.network.network_gbps:g} GB/s between nodes.",
            "Estimate per GPU (mimo/planner/memory.py): 16 B per trainable parameter (fp32 weights, "
            "grads, AdamW moments) / tp for sharded weights, / dp with FSDP; activations ~34 B x tokens x hidden "
            "per layer (bf16, flash attention; 10+24/tp under TP, 34/tp with SP; x2 in float32) plus fp32 logits "
            "and their grad; 1F1B stages hold up to min(stages, microbatches) microbatches (beside a pipelined LM, "
            "colocated encoders hold every microbatch's); + 2 GiB fixed."]
    return "\n".join(out)


def row_json(rank: int, row: Row) -> dict:
    """One candidate's fields (docs/planner.md lists them)."""
    p = row.prediction
    grids = {n: {"offset": g.offset, "size": g.size, "tp": g.tp, "cp": g.cp, "pp": g.pp, "dp": g.dp}
             for n, g in row.layout.grids.items()}
    return {"rank": rank, "label": label(row.layout, row.modules), "kind": KIND[row.klass],
            "modules": {n: dataclasses.asdict(m) for n, m in row.modules.items()}, "grids": grids,
            "microbatches": row.microbatches, "fits": row.fits, "peak_gib": row.peak_gib,
            "states_gib": row.usage.states / GIB,
            "activations_gib": row.usage.activations / GIB, "predicted_step_s": p.step_s,
            "compute_s": p.compute_s, "comm_s": p.comm_s, "reduce_s": p.reduce_s, "optimizer_s": p.optimizer_s,
            "bubble_s": p.bubble_s, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": p.model_tflops_per_gpu, "mfu": p.mfu, "why": row.why}


def to_json(cfg: Config, plan: Plan) -> str:
    """Every candidate, best first, and what they were costed for, as one JSON object."""
    best = plan.rows[0]
    return json.dumps({
        "gpus": plan.gpus, "nodes": math.ceil(plan.gpus / plan.network.gpus_per_node),
        "gpu_memory_gib": plan.gpu_memory_gib, "profile": plan.profile.device,
        "network": dataclasses.asdict(plan.network), "microbatches": cfg.parallel.microbatches,
        "global_batch": cfg.data.global_batch, "seq_len": plan.sizes[LANGUAGE].tokens_per_sample,
        "best_toml": to_toml(best.modules, best.microbatches, best.layout),
        "candidates": [row_json(i + 1, r) for i, r in enumerate(plan.rows)]}, indent=1)


def default_gpu_memory_gib() -> float:
    """The local GPU's memory where CUDA is available, else 80 GiB (an H100/A100-80GB)."""
    import torch

    if torch.cuda.is_available():
        return math.floor(torch.cuda.get_device_properties(0).total_memory / GIB * 10) / 10
    return 80.0
