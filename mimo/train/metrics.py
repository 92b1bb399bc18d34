"""Run outputs: metrics.jsonl, TensorBoard scalars, W&B (optional), the progress bar and summary.json.

The JSON files are strict JSON: a non-finite loss or gradient norm (a skipped step) is written as null."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from tqdm import tqdm

from mimo.train.wandb_mirror import WandbMirror


def scalars(record: dict, prefix: str) -> dict[str, float]:
    """The numeric entries of a (nested) record as flat `prefix/key` names; booleans count as numbers."""
    out: dict[str, float] = {}
    for k, v in record.items():
        if isinstance(v, dict):
            out.update(scalars(v, f"{prefix}/{k}"))
        elif isinstance(v, (int, float)):
            out[f"{prefix}/{k}"] = v
    return out


def finite_or_null(value: object) -> object:
    """`value` with every non-finite float (NaN, +-Infinity) inside dicts and lists replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def to_json(value: object, **kwargs: object) -> str:
    """Strict JSON (what `json.loads` reads with NaN refused): non-finite numbers are written as null."""
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)


class MetricsLogger:
    """Writes one JSON object per logged step and mirrors scalars to TensorBoard and W&B (rank 0 only).

    `wandb` is a WandbMirror's arguments beyond the run folder (project, name, config), or None for no W&B.
    """

    def __init__(self, run_dir: Path, total_steps: int, tensorboard: bool, progress: bool, enabled: bool = True,
                 start_step: int = 0, wandb: dict | None = None):
        self.enabled = enabled
        self.run_dir = run_dir
        self.t0 = time.perf_counter()
        self.history: list[dict] = []
        self.tb = None
        self.bar = None
        self.wandb = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.file = (run_dir / "metrics.jsonl").open("a")
        if wandb is not None:
            self.wandb = WandbMirror(run_dir, **wandb, resumed=start_step > 0)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if progress:
            self.bar = tqdm(total=total_steps, initial=start_step, dynamic_ncols=True, desc="train")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log(self, record: dict) -> None:
        record = {**record, "elapsed_s": round(self.elapsed(), 3)}
        self.history.append(record)
        if not self.enabled:
            return
        self.file.write(to_json(record) + "\n")
        self.file.flush()
        values = scalars({k: v for k, v in record.items() if k != "step"}, "train")
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, record["step"])
        if self.wandb is not None:
            self.wandb.log(values, record["step"])

    def log_eval(self, step: int, values: dict) -> None:
        """A periodic evaluation after `step`: `{"step", "eval_<key>": ...}` in metrics.jsonl (one line of
        its own), `eval/<key>` in TensorBoard and W&B."""
        self.history.append({"step": step, **{f"eval_{k}": v for k, v in values.items()}})
        if not self.enabled:
            return
        self.file.write(to_json(self.history[-1]) + "\n")
        self.file.flush()
        named = scalars(values, "eval")
        if self.tb is not None:
            for k, v in named.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(named, step)

    def progress(self, n: int, **postfix: float) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def note(self, message: str) -> None:
        """One line on stderr (rank 0 only), above the progress bar when there is one."""
        if not self.enabled:
            return
        if self.bar is not None:
            tqdm.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def write_summary(self, summary: dict) -> None:
        if self.enabled:
            (self.run_dir / "summary.json").write_text(to_json(summary, indent=2) + "\n")
        if self.wandb is not None:
            self.wandb.summary(scalars(summary, "summary"))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None
        if self.enabled:
            self.file.close()
