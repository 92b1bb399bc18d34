"""The step simulator: pipeline schedules run on a clock, with their bubbles.

A pipeline is a DAG of *virtual stages* (vstages), each run by one rank (a rank may run several: the
interleaved schedule). Every rank executes its list of ops in a fixed order; an op starts when its rank is
free and its inputs have arrived:

- `F(t)` at vstage v: after `F(t)` of every predecessor of v, plus that predecessor's send time;
- `B(t)` at vstage v: after `B(t)` of every successor of v, plus v's send time (the gradient comes back
  over the same link); at a vstage without successors (the loss), after its own `F(t)`;
- `C(i)`: collective i, on every rank that lists it, at once: it starts when the last of them reaches it;
- `H(i)`: host copy i, on its rank alone, when the rank is free (no inputs).

A colocated layout whose LM is pipelined runs three phases on every rank (`colocated_pipeline_ops`): its
encoders' forwards of every microbatch, one collective handing the rows to the LM's first stage, the LM's
pipeline, one collective handing their gradients back, then the encoders' backwards.

The ops of the multi-module 1F1B are mimo's own (`mimo.parallel.pipeline.schedule.run_1f1b`, driven with a
recording stage, so the simulated order is the trained one by construction); so is the interleaved order
(`interleaved_order`, Megatron's: virtual stage `chunk * pp + rank`, chunks of pp microbatches). Times are per
microbatch per vstage. Pure Python, no device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mimo.parallel.pipeline.schedule import interleaved_order, run_1f1b, warmup_microbatches

Op = tuple[str, int, int]
"""("F" or "B", microbatch, vstage), or ("C" or "H", index, -1): a collective or a host copy."""


@dataclass
class Timeline:
    """What the clock gave: each op's (start, end) per rank, in execution order, and the makespan."""

    events: list[list[tuple[Op, float, float]]]
    makespan: float
    busy: list[float] = field(default_factory=list)

    def bubble(self, rank: int) -> float:
        """Seconds rank `rank` waited inside the makespan."""
        return self.makespan - self.busy[rank]


class _Recorder:
    """A `Stage` for run_1f1b that writes down the ops it is asked to run."""

    def __init__(self, vstage: int):
        self.vstage, self.ops, self.in_flight = vstage, [], []

    def forward(self, t: int) -> None:
        self.ops.append(("F", t, self.vstage))
        self.in_flight.append(t)

    def backward(self) -> None:
        self.ops.append(("B", self.in_flight.pop(0), self.vstage))


def one_f_one_b_ops(stage: int, total_stages: int, microbatches: int) -> list[Op]:
    """The ops of DAG stage `stage` (encoders first, then the LM) in the order mimo's schedule runs them."""
    return plain_ops(stage, microbatches, warmup_microbatches(total_stages, stage, microbatches))


def plain_ops(vstage: int, microbatches: int, warmup: int) -> list[Op]:
    """The ops of a plain 1F1B stage at `vstage` with `warmup` forwards before its first backward (`run_1f1b`)."""
    rec = _Recorder(vstage)
    run_1f1b(rec, microbatches, warmup)
    return rec.ops


def interleaved_ops(rank: int, pp: int, chunks: int, microbatches: int) -> list[Op]:
    """The runtime's interleaved 1F1B order (`mimo.parallel.pipeline.schedule.interleaved_order`) for `rank` of
    `pp` ranks holding `chunks` model chunks each, as vstages (chunk * pp + rank); microbatches must divide by pp."""
    return [(kind, t, chunk * pp + rank) for kind, t, chunk in interleaved_order(rank, pp, chunks, microbatches)]


def colocated_pipeline_ops(pp: int, chunks: int, microbatches: int,
                           offload: bool = False) -> tuple[list[list[Op]], dict[int, list[int]]]:
    """(each LM stage's rank's ops, every vstage's predecessors) of one step of a colocated layout whose LM is
    pipelined over `pp` ranks of `chunks` model chunks each: the LM's vstages are 0 .. pp x chunks - 1 (plain
    1F1B, or `interleaved_ops`), rank r's encoders (all of them, one after the other) vstage pp x chunks + r.
    Rank r runs its encoders' forwards of every microbatch, collective 0 (the rows to the LM's first stage),
    the LM's ops, collective 1 (their gradients back), its encoders' backwards; with `offload` host copy 0 (the
    encoders' states to the host) right after collective 0 and host copy 1 (back) right before collective 1."""
    vstages = pp * chunks
    ranks = []
    for r in range(pp):
        enc = vstages + r
        lm = interleaved_ops(r, pp, chunks, microbatches) if chunks > 1 else one_f_one_b_ops(r, pp, microbatches)
        out, back = [("H", 0, -1)] if offload else [], [("H", 1, -1)] if offload else []
        ranks.append([("F", t, enc) for t in range(microbatches)] + [("C", 0, -1)] + out + lm + back
                     + [("C", 1, -1)] + [("B", t, enc) for t in range(microbatches)])
    preds = {v: [v - 1] if v else [] for v in range(vstages)} | {vstages + r: [] for r in range(pp)}
    return ranks, preds


def schedule_bubble(pp: int, chunks: int, microbatches: int) -> tuple[float, float]:
    """(idle, busy) time of the worst rank of an LM pipeline of `pp` ranks under the runtime's own schedule
    (plain 1F1B for one chunk, else interleaved over `chunks`), every stage costing the same: one unit is a
    microbatch's forward plus backward through one rank's layers (forward = backward, so a chunk's op takes
    1 / (2 chunks)). The hand formulas: idle / busy = (pp - 1) / m for 1F1B, (pp - 1) / (chunks m) interleaved."""
    vstages = pp * chunks
    if chunks == 1:
        ops = [one_f_one_b_ops(r, pp, microbatches) for r in range(pp)]
    else:
        ops = [interleaved_ops(r, pp, chunks, microbatches) for r in range(pp)]
    cost = dict.fromkeys(range(vstages), 0.5 / chunks)
    timeline = simulate(ops, {v: [v - 1] if v else [] for v in range(vstages)}, cost, cost)
    rank = max(range(pp), key=timeline.bubble)
    return timeline.bubble(rank), timeline.busy[rank]


def simulate(rank_ops: list[list[Op]], preds: dict[int, list[int]], forward_s: dict[int, float],
             backward_s: dict[int, float], send_s: dict[int, float] | None = None,
             fixed_s: dict[tuple[str, int], float] | None = None) -> Timeline:
    """Run every rank's ops on a clock. `preds[v]`: the vstages feeding v; `send_s[v]`: the time of v's
    message to each successor (and of the gradient back); `fixed_s[(kind, i)]`: the time of collective or host
    copy i. Raises on an order that cannot finish."""
    send_s, fixed_s = send_s or {}, fixed_s or {}
    succs: dict[int, list[int]] = {v: [] for v in preds}
    for v, ps in preds.items():
        for p in ps:
            succs[p].append(v)
    done: dict[Op, float] = {}
    free = [0.0] * len(rank_ops)
    nxt = [0] * len(rank_ops)
    events: list[list[tuple[Op, float, float]]] = [[] for _ in rank_ops]
    busy = [0.0] * len(rank_ops)
    members = _collective_members(rank_ops)

    def run(r: int, start: float, seconds: float) -> None:
        op = rank_ops[r][nxt[r]]
        done[op], free[r] = start + seconds, start + seconds
        events[r].append((op, start, start + seconds))
        busy[r] += seconds
        nxt[r] += 1

    remaining = sum(map(len, rank_ops))
    while remaining:
        progressed = False
        for r, ops in enumerate(rank_ops):
            while nxt[r] < len(ops):
                kind, i, v = op = ops[nxt[r]]
                if kind == "C":
                    if any(nxt[q] >= len(rank_ops[q]) or rank_ops[q][nxt[q]] != op for q in members[op]):
                        break
                    start = max(free[q] for q in members[op])
                    for q in members[op]:
                        run(q, start, fixed_s[(kind, i)])
                    remaining -= len(members[op])
                elif kind == "H":
                    run(r, free[r], fixed_s[(kind, i)])
                    remaining -= 1
                else:
                    ready = _ready(op, preds, succs, send_s, done)
                    if ready is None:
                        break
                    run(r, max(free[r], ready), forward_s[v] if kind == "F" else backward_s[v])
                    remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: ops[nxt[r]] for r, ops in enumerate(rank_ops) if nxt[r] < len(ops)}
            raise ValueError(f"the schedule cannot finish: every rank waits ({stuck})")
    return Timeline(events, max(free, default=0.0), busy)


def _collective_members(rank_ops: list[list[Op]]) -> dict[Op, list[int]]:
    """The ranks that list each collective op."""
    members: dict[Op, list[int]] = {}
    for r, ops in enumerate(rank_ops):
        for op in ops:
            if op[0] == "C":
                members.setdefault(op, []).append(r)
    return members


def _ready(op: Op, preds: dict[int, list[int]], succs: dict[int, list[int]], send_s: dict[int, float],
           done: dict[Op, float]) -> float | None:
    """When op's inputs have arrived, or None when one of them is not computed yet."""
    kind, t, v = op
    if kind == "F":
        needs = [(("F", t, p), send_s.get(p, 0.0)) for p in preds[v]]
    elif succs[v]:
        needs = [(("B", t, s), send_s.get(v, 0.0)) for s in succs[v]]
    else:
        needs = [(("F", t, v), 0.0)]
    if any(n not in done for n, _ in needs):
        return None
    return max((done[n] + lag for n, lag in needs), default=0.0)
