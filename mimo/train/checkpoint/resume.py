"""Saving a run's complete state every N steps and on a stop, and resuming from it exactly.

A checkpoint `checkpoints/step_N` holds the state after N completed steps:
- DCP files: per module, its weights and its optimizer's per-parameter state (see checkpoint.py);
- `state.json`: the next step (which fixes the LR schedule position and, because the sample order is
  a pure function of (step, global batch, seed), the data position, stored explicitly too), the
  bad-step counters, the data reader's counters and the layout it was written with;
- `rng/rank_XXXXX.json`: each rank's torch / CUDA / numpy / Python RNG states.
Resuming loads all of it, so the resumed run's losses match the uninterrupted run's bit for bit on
the CPU. Every function named "collective" must be called by every rank.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from mimo.config.load import to_dict
from mimo.config.schema import Config, ConfigError
from mimo.parallel.plan import ParallelPlan
from mimo.parallel.verdict import first_problem
from mimo.train.checkpoint.reshard import full_shapes, globalize
from mimo.train.checkpoint.safe_dcp import CorruptCheckpointError
from mimo.train.checkpoint.store import (
    MARKER,
    STAGING,
    CheckpointStore,
    Found,
    crc32,
    folder_step,
    validate,
    verify_share,
)
from mimo.train.checkpoint.weights import load_training_state, save_training_state, training_state
from mimo.train.faults import RunAborted, StepGuard
from mimo.train.optim import StepOptimizer
from mimo.train.rng import capture_rng, check_rng, restore_rng

STATE = "state.json"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_file(root: Path, rank: int) -> Path:
    return root / "rng" / f"rank_{rank:05d}.json"


def _sums_file(root: Path, rank: int) -> Path:
    return root / "sums" / f"rank_{rank:05d}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"'{path}' is unreadable ({e})") from e


def _same_everywhere(text: str) -> bool:
    """Collective: whether every rank passed the same `text` (compared by CRC-32 and length)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return True
    mine = torch.tensor([zlib.crc32(text.encode()), len(text)], dtype=torch.int64)
    lo, hi = mine.clone(), mine.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return torch.equal(lo, hi)


def _why(e: CheckpointException) -> str:
    """The first failing rank's exception of a DCP load, in one line (DCP's own text holds every traceback)."""
    rank, (exc, _) = min(e.failures.items())
    text = str(exc).strip().splitlines()
    return f"rank {rank}: {type(exc).__name__}: {text[0] if text else ''}"


def _check_step(path: Path, step: int) -> None:
    """A checkpoint is damaged (CorruptCheckpointError) unless its state.json's `step` is the one its completion
    marker records, and its `step_N` folder name where it has one, and at least 1 (no save precedes a step)."""
    marker = _read_json(path / MARKER)
    marked = marker.get("step") if isinstance(marker, dict) else None
    named = folder_step(path.name)
    if step != marked or named not in (-1, step) or step < 1:
        raise CorruptCheckpointError(f"'{path / STATE}' says next_step {step}, but its completion marker says step "
                                     f"{marked}" + (f" and its folder name {named}" if named >= 0 else ""))


def trim_metrics(path: Path, next_step: int) -> None:
    """Keep only the records of steps before `next_step` (a resumed run rewrites the later ones)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) < next_step:
                kept.append(line + "\n")
        except ValueError:
            continue
    path.write_text("".join(kept))


class RunCheckpointer:
    """Saves and restores one trainer's state. `data` may offer `state_dict()`/`load_state_dict()`
    (JSON-able counters of a real-data reader); `plan` the run's ParallelPlan, whose TP meshes let
    tensor-parallel chunks be saved and resharded (none on one process: every tensor saved whole)."""

    def __init__(self, cfg: Config, run_dir: Path, modules: dict[str, nn.Module], optimizer: StepOptimizer,
                 guard: StepGuard, plan: ParallelPlan, data: object = None):
        self.cfg, self.run_dir, self.modules, self.optimizer = cfg, Path(run_dir), modules, optimizer
        self.guard, self.rank, self.data = guard, plan.rank, data
        self.store = CheckpointStore(self.run_dir / "checkpoints", cfg.checkpoint.keep)
        sharded = set(plan.fsdp_modules())  # FSDP over TP chunks: each chunk sharded over dp
        self.tp_meshes = {n: plan.groups[n].plane_mesh("tp", "dp") if n in sharded else
                          plan.groups[n].device_mesh("tp") for n in modules
                          if plan.layout.grids[n].tp > 1 and plan.groups[n].member}
        self.expert_mesh = plan.expert_mesh()
        self.shapes = full_shapes(cfg.model) if self.tp_meshes or self.expert_mesh else {}
        self.resumed_from: str | None = None
        self.wall_before = 0.0
        """Seconds the run's earlier segments trained (state.json's wall_s of the checkpoint loaded)."""
        self.clock_start = time.perf_counter()
        self.last_saved = -1
        self.ignored: list[str] = []
        self.damaged: list[Path] = []

    def start_clock(self) -> None:
        """This segment's training starts now (run_wall_s counts from here)."""
        self.clock_start = time.perf_counter()

    def run_wall_s(self) -> float:
        """The whole run's training time so far: earlier segments' plus this one's since start_clock."""
        return self.wall_before + time.perf_counter() - self.clock_start

    def report(self, message: str) -> None:
        if self.rank == 0:
            print(f"mimo: checkpoint: {message}", file=sys.stderr, flush=True)

    def _to_dcp(self, tree: dict) -> dict:
        return globalize(tree, self.shapes, self.tp_meshes, self.expert_mesh) if self.shapes else tree

    # Saving ----------------------------------------------------------------------------------------
    def save(self, next_step: int, reason: str) -> Path:
        """Collective: write the state after `next_step` completed steps and publish it atomically."""
        if self.rank == 0:
            self.store.prepare(next_step)
        _barrier()
        tmp = self.store.staging(next_step)
        rng = _rng_file(tmp, self.rank)
        rng.parent.mkdir(parents=True, exist_ok=True)
        rng.write_text(json.dumps(capture_rng()))
        state = training_state(self.modules, self.optimizer.optimizers, self.optimizer.master_state(self.rank))
        save_training_state(tmp, self._to_dcp(state))
        mine = [rng, *tmp.glob(f"__{self.rank}_*")]
        sums = _sums_file(tmp, self.rank)
        sums.parent.mkdir(exist_ok=True)
        sums.write_text(json.dumps({str(f.relative_to(tmp)): crc32(f) for f in mine}))
        _barrier()
        if self.rank == 0:
            (tmp / STATE).write_text(json.dumps(self._state(next_step, reason), indent=1))
            checksums = {k: v for f in sorted(sums.parent.iterdir()) for k, v in _read_json(f).items()}
            self.store.publish(next_step, {"reason": reason}, checksums)
        _barrier()
        self.last_saved = next_step
        return self.store.path(next_step)

    def save_final(self, steps: int) -> Path:
        """Collective: the run's final weights as a checkpoint like the others (sharded, never gathered);
        the one `checkpoint.save_every` just wrote when it fell on the last step."""
        return self.store.path(steps) if self.last_saved == steps else self.save(steps, "final")

    def _state(self, next_step: int, reason: str) -> dict:
        d = self.cfg.data
        return {
            "next_step": next_step,
            "reason": reason,
            "wall_s": round(self.run_wall_s(), 3),
            "schedule": {"step": next_step, "total_steps": self.optimizer.total_steps},
            "data": {"name": d.name, "next_step": next_step, "consumed_samples": next_step * d.global_batch,
                     "global_batch": d.global_batch, "seed": d.seed,
                     "reader": self.data.state_dict() if hasattr(self.data, "state_dict") else {}},
            "bad_steps": {"consecutive": self.guard.consecutive_bad, "total": self.guard.total_bad},
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "parallel": to_dict(self.cfg)["parallel"],
            "master_weights": self.cfg.precision.master_weights,
        }

    # Resuming --------------------------------------------------------------------------------------
    def _explicit(self) -> bool:
        return not (self.cfg.checkpoint.resume is True or self.cfg.checkpoint.resume == "auto")

    def _candidates(self) -> list[Found]:
        mode = self.cfg.checkpoint.resume
        if not self._explicit():
            good, bad = self.store.scan()
            for f in bad:
                self.ignored.append(f"{f.path}: {f.problem}")
                self.report(f"ignoring '{f.path}': {f.problem}")
                if not f.path.name.startswith(STAGING):
                    self.damaged.append(f.path)
            return good
        path = Path(str(mode))
        problem = validate(path) if path.is_dir() else "no such folder"
        if problem:
            raise ConfigError(f"checkpoint.resume = '{mode}' is not a loadable checkpoint ({problem}); nothing in "
                              "the run folder was changed. Pass a checkpoints/step_* folder of a run, or true for the "
                              "newest complete one")
        # The step only orders candidates; `_load` reads (and checks) state.json itself.
        return [Found(path, folder_step(path.name))]

    def resume(self) -> int:
        """Collective: load the newest usable checkpoint that checkpoint.resume allows; returns the step to
        start from (0 when there is none). Every rank reads its parts of a candidate first and the ranks
        agree (one small collective) whether all of them could, so all load the same one or skip it together.
        With resume = true corrupt checkpoints are reported and skipped; an explicit path that cannot be
        loaded raises ConfigError naming the file and why, before the run folder is touched. Says nothing when no
        checkpoint loads: the trainer then starts over, or refuses a folder that holds another run."""
        mode = self.cfg.checkpoint.resume
        if mode is False or mode == "never":
            return 0
        candidates = self._candidates()
        self._agree([f.step for f in candidates])
        for found in candidates:
            problem, step = self._try_load(found.path)
            if problem and self._explicit():
                raise ConfigError(f"checkpoint.resume = '{mode}' cannot be loaded: {problem}. Nothing in the run "
                                  "folder was changed; name another checkpoint, or true for the newest complete one")
            if problem:
                self.ignored.append(f"{found.path}: {problem}")
                self.damaged.append(found.path)
                self.report(f"ignoring '{found.path}': {problem}")
                continue
            self.resumed_from = str(found.path)
            self.report(f"resumed from '{found.path}' at step {step}")
            if self.rank == 0:
                trim_metrics(self.run_dir / "metrics.jsonl", step)
            return step
        return 0

    def set_aside_damaged(self) -> None:
        """Rank 0, once the run may go on: rename each published checkpoint that was skipped as damaged to
        `step_XXXXXXXX.damaged` (`.damaged-2`, ...), out of the way of saves and pruning, never deleted."""
        if self.rank != 0:
            return
        for path in self.damaged:
            target, n = path.with_name(path.name + ".damaged"), 1
            while target.exists():
                n += 1
                target = path.with_name(f"{path.name}.damaged-{n}")
            if path.is_dir():
                path.rename(target)
                self.report(f"moved the damaged '{path}' to '{target}'")

    def _agree(self, steps: list[int]) -> None:
        """Collective: every rank must have found the same checkpoints (a shared file system)."""
        mine = ",".join(map(str, steps))
        if not _same_everywhere(mine):
            raise RuntimeError(f"ranks see different checkpoints under '{self.store.root}' (rank {self.rank}: steps "
                               f"{mine or 'none'}); every rank needs the same file system for run.out_dir")

    def _read_parts(self, path: Path) -> tuple[dict, dict | None]:
        """This rank's own reading of a checkpoint, before anything is loaded: state.json, its RNG file and
        its share of the CRC check. Raises CorruptCheckpointError naming the file and what is wrong."""
        state = _read_json(path / STATE)
        if not isinstance(state, dict) or not isinstance(state.get("next_step"), int):
            raise CorruptCheckpointError(f"'{path / STATE}' has no next_step")
        _check_step(path, state["next_step"])
        rng_path = _rng_file(path, self.rank)
        rng = _read_json(rng_path) if rng_path.is_file() else None
        if rng is not None:
            try:
                check_rng(rng)
            except ValueError as e:
                raise CorruptCheckpointError(f"'{rng_path}' is unreadable ({e})") from e
        world = dist.get_world_size() if dist.is_initialized() else 1
        changed = verify_share(path, self.rank, world)
        if changed:
            raise CorruptCheckpointError(f"the contents of {[str(path / c) for c in changed[:3]]} differ from when "
                                         "they were written (CRC-32)")
        return state, rng

    def _try_load(self, path: Path) -> tuple[str, int]:
        """Collective: ("", next step) after loading `path` on every rank, or (why not, -1) on every rank. A
        checkpoint past train.steps raises ConfigError on every rank, before anything is loaded."""
        state: dict = {}
        rng = None
        try:
            state, rng = self._read_parts(path)
            problem = ""
        except CorruptCheckpointError as e:
            problem = str(e)
        rank, problem = first_problem(problem)
        if problem:
            return (f"rank {rank}: {problem}" if dist.is_initialized() else problem), -1
        if state["next_step"] > self.cfg.train.steps:
            raise ConfigError(f"checkpoint '{path}' holds the state after step {state['next_step']}, past this run's "
                              f"train.steps = {self.cfg.train.steps}; nothing in the run folder was changed. Set "
                              f"--train.steps={state['next_step']} or more to continue it")
        try:
            self._load(path, state, rng)
        except CorruptCheckpointError as e:
            return f"it failed to load ({e})", -1
        except CheckpointException as e:
            return f"its tensors in {sorted(f.name for f in path.glob('*.distcp'))} failed to load ({_why(e)})", -1
        return "", state["next_step"]

    def _load(self, path: Path, state: dict, rng: dict | None) -> None:
        """Collective: check that the checkpoint fits this run, then load everything."""
        d, saved = self.cfg.data, state.get("data", {})
        for key in ("global_batch", "seed"):
            if saved.get(key) != getattr(d, key):
                raise ValueError(f"checkpoint '{path}' was written with data.{key} = {saved.get(key)}, this run has "
                                 f"{getattr(d, key)}; resume with the same value (the sample order depends on it)")
        self._check_master_state(path, state)
        load_training_state(path, self.modules, self.optimizer.optimizers, self._to_dcp,
                            self.optimizer.master_state(self.rank))
        if rng is None:
            self.report(f"'{path}' has no RNG state for rank {self.rank} (written by fewer ranks); keeping this "
                        "rank's seeded state")
        else:
            restore_rng(rng)
        self.wall_before = float(state.get("wall_s", 0.0))
        bad = state.get("bad_steps", {})
        self.guard.consecutive_bad, self.guard.total_bad = int(bad.get("consecutive", 0)), int(bad.get("total", 0))
        if hasattr(self.data, "load_state_dict"):
            self.data.load_state_dict(saved.get("reader", {}))

    def _check_master_state(self, path: Path, state: dict) -> None:
        """A checkpoint's optimizer state must be of this run's kind: torch AdamW's per parameter, or
        precision.master_weights' fp32 shards, which load on the layout (world size and parallel.modules) they were
        written with only (each rank's shard of each module's flat buffer)."""
        mine = self.cfg.precision.master_weights
        if bool(state.get("master_weights", False)) != mine:
            raise ValueError(f"checkpoint '{path}' was written with precision.master_weights = "
                             f"{str(not mine).lower()}, this run has {str(mine).lower()}: its optimizer state is of "
                             "the other kind; resume with the same value")
        world = dist.get_world_size() if dist.is_initialized() else 1
        modules = to_dict(self.cfg)["parallel"]["modules"]
        if mine and (state.get("world_size") != world or state.get("parallel", {}).get("modules") != modules):
            raise ValueError(f"checkpoint '{path}' holds precision.master_weights' fp32 state sharded over the layout "
                             f"it was written with ({state.get('world_size')} ranks, its parallel.modules), which "
                             f"this run ({world} ranks) does not match; resume on that layout")

    # The loop's hook ---------------------------------------------------------------------------------
    def after_step(self, step: int) -> bool:
        """Collective: save when due; True when the run must stop now (SIGTERM, agreed by all ranks).
        Raises RunAborted, after saving, once train.max_bad_steps consecutive steps were skipped."""
        done = step + 1
        if self.guard.exhausted:
            path = self.save(done, "bad_steps")
            raise RunAborted(f"stopped after step {step}: the last {self.guard.consecutive_bad} steps "
                             f"(train.max_bad_steps = {self.cfg.train.max_bad_steps}) had a non-finite loss or "
                             f"gradient norm and were skipped; saved '{path}'. Lower optim.lr, check the data, "
                             "or raise train.max_bad_steps, then resume with --checkpoint.resume=true")
        if self.guard.stop_requested:
            path = self.save(done, "sigterm")
            self.report(f"SIGTERM: saved '{path}' after step {step}; resume with --checkpoint.resume=true")
            return True
        every = self.cfg.checkpoint.save_every
        if every and (done % every == 0 or done == self.cfg.train.steps):
            self.save(done, "periodic")
        return False
