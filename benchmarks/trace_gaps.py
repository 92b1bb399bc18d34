"""Where the GPU waits: busy and idle time of each phase of a profiled step, from a Chrome trace.

The profiled step launches a marker kernel (`torch.cuda._sleep`, named `spin_kernel`) at the end of
each phase, so the device timeline splits into phases even where the host ran far ahead of it or the
kernels came from autograd's own thread. Idle time inside a phase is time the GPU had nothing queued:
launch overhead, host work, or a wait.
"""

from __future__ import annotations

import json
from pathlib import Path

MARKER = "spin_kernel"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def device_events(trace: dict) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every kernel, copy and fill on the device, by start time."""
    events = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("name", ""))
              for e in trace.get("traceEvents", []) if e.get("cat") in DEVICE_CATEGORIES and "ts" in e]
    return sorted(events)


def busy_time(events: list[tuple[float, float, str]]) -> float:
    """Length of the union of the intervals (kernels of several streams may overlap)."""
    total, end = 0.0, float("-inf")
    for s, e, _ in events:
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def compute_and_communication(events: list[tuple[float, float, str]]) -> dict[str, float]:
    """Where one GPU's profiled step went, in ms: `span` from its first to its last device event;
    `compute`, time some non-NCCL kernel ran; `exposed_comm`, time only NCCL kernels ran (communication
    not hidden behind compute, and waiting for a peer: an NCCL kernel runs until its peer joins);
    `idle`, time nothing ran. compute + exposed_comm + idle = span."""
    if not events:
        return {"span": 0.0, "compute": 0.0, "exposed_comm": 0.0, "idle": 0.0}
    busy = busy_time(events)
    compute = busy_time([e for e in events if "nccl" not in e[2].lower()])
    span = max(e for _, e, _ in events) - events[0][0]
    return {"span": span / 1e3, "compute": compute / 1e3, "exposed_comm": (busy - compute) / 1e3,
            "idle": (span - busy) / 1e3}


def phase_table(events: list[tuple[float, float, str]], names: list[str]) -> list[dict]:
    """One row per phase: the events between consecutive markers, named in order by `names`."""
    marks = [i for i, ev in enumerate(events) if MARKER in ev[2]]
    if len(marks) != len(names):
        raise ValueError(f"{len(marks)} marker kernels in the trace but {len(names)} phase names")
    rows, start_i, start_t = [], 0, events[0][0] if events else 0.0
    for name, m in zip(names, marks):
        inside = events[start_i:m]
        window = events[m][0] - start_t
        busy = busy_time(inside)
        rows.append({"phase": name, "kernels": len(inside), "wall_ms": window / 1e3, "busy_ms": busy / 1e3,
                     "idle_ms": max(0.0, window - busy) / 1e3})
        start_i, start_t = m + 1, events[m][1]
    return rows


def largest_gaps(events: list[tuple[float, float, str]], k: int = 10) -> list[tuple[float, str, str]]:
    """The k longest stretches with nothing running: (ms, kernel before, kernel after)."""
    gaps, end, before = [], None, ""
    for s, e, name in events:
        if end is not None and s > end:
            gaps.append(((s - end) / 1e3, before, name))
        if end is None or e >= end:
            end, before = e, name
    return sorted(gaps, reverse=True)[:k]


def report(trace_path: str | Path, names: list[str]) -> str:
    events = device_events(json.loads(Path(trace_path).read_text()))
    if not events:
        return "no device events in the trace"
    rows = phase_table(events, names)
    lines = ["| phase | kernels | wall ms | busy ms | idle ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['kernels']} | {r['wall_ms']:.2f} | {r['busy_ms']:.2f} | {r['idle_ms']:.2f} |"
              for r in rows]
    total = {k: sum(r[k] for r in rows) for k in ("wall_ms", "busy_ms", "idle_ms")}
    lines.append(f"| total | {sum(r['kernels'] for r in rows)} | {total['wall_ms']:.2f} | {total['busy_ms']:.2f} | "
                 f"{total['idle_ms']:.2f} |")
    lines += ["", "largest gaps (ms, kernel before -> kernel after):"]
    lines += [f"  {ms:.3f}  {a[:70]} -> {b[:70]}" for ms, a, b in largest_gaps(events)]
    return "\n".join(lines)
