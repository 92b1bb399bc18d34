"""The run's loss curve as a PNG drawn with Pillow (no plotting library needed): the training loss of every
step of the whole run (earlier segments of a resumed run from metrics.jsonl) and the held-out loss of each
periodic evaluation as points."""

from __future__ import annotations

import json
import math
from pathlib import Path

from PIL import Image, ImageDraw

TRAIN_COLOUR, EVAL_COLOUR, GRID_COLOUR = (30, 90, 200), (220, 90, 20), (225, 225, 225)
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 720, 440, 64, 20, 30, 44
TICKS = 5


def run_curve(metrics: Path, start: int, losses: list[tuple[int, float]]) -> tuple[list, list]:
    """(train points, eval points) of the whole run as (step, value) lists, non-finite values left out: the
    logged losses of steps before `start` read from `metrics` (metrics.jsonl, already trimmed to them on a
    resume), then `losses` (this segment's every step), and every `eval_loss` line of `metrics`."""
    train, evals = [], []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row.get("eval_loss"), (int, float)):
                evals.append((row["step"], float(row["eval_loss"])))
            elif isinstance(row.get("loss"), (int, float)) and row.get("step", start) < start:
                train.append((row["step"], float(row["loss"])))
    train += [(s, v) for s, v in losses if v is not None and math.isfinite(v)]
    return sorted(train), sorted(evals)


def nice_ticks(lo: float, hi: float, log: bool) -> list[float]:
    """TICKS values spread over [lo, hi], evenly on a log scale when `log`."""
    if log:
        a, b = math.log10(lo), math.log10(hi)
        return [10 ** (a + (b - a) * i / (TICKS - 1)) for i in range(TICKS)]
    return [lo + (hi - lo) * i / (TICKS - 1) for i in range(TICKS)]


def step_ticks(s0: int, s1: int) -> list[int]:
    """Round steps (multiples of 1, 2 or 5 x 10^k) over [s0, s1], about TICKS of them."""
    raw = max((s1 - s0) / (TICKS - 1), 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    step = int(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))
    return list(range(-(-s0 // step) * step, s1 + 1, step))


def plot_curve(train: list[tuple[int, float]], path: str | Path, evals: list[tuple[int, float]] = (),
               resumed_at: int = 0, title: str = "loss") -> None:
    """Draw `train` as a line and `evals` as points over the steps; a log loss axis when the values are
    positive and span more than 4x; a grey line at `resumed_at` (> 0) where this segment began."""
    img = Image.new("RGB", (WIDTH, HEIGHT), "white")
    d = ImageDraw.Draw(img)
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    points = [*train, *evals]
    if len(points) >= 2:
        values = [v for _, v in points]
        lo, hi = min(values), max(values)
        hi = hi if hi > lo else lo + 1.0
        log = lo > 0 and hi / lo > 4
        f = math.log10 if log else (lambda v: v)
        s0 = min(s for s, _ in points)
        s1 = max(max(s for s, _ in points), s0 + 1)

        def xy(s: float, v: float) -> tuple[float, float]:
            return (x0 + (s - s0) / (s1 - s0) * (x1 - x0), y1 - (f(v) - f(lo)) / (f(hi) - f(lo)) * (y1 - y0))

        for v in nice_ticks(lo, hi, log):
            _, y = xy(s0, v)
            d.line([(x0, y), (x1, y)], fill=GRID_COLOUR)
            d.text((4, y - 6), f"{v:.3g}", fill="black")
        for s in step_ticks(s0, s1):
            x, _ = xy(s, lo)
            d.line([(x, y0), (x, y1)], fill=GRID_COLOUR)
            d.text((x - 12, y1 + 6), f"{s:.0f}", fill="black")
        if 0 < resumed_at <= s1:
            x, _ = xy(resumed_at, lo)
            d.line([(x, y0), (x, y1)], fill=(150, 150, 150), width=1)
            d.text((x + 3, y0 + 2), "resumed", fill=(120, 120, 120))
        if len(train) >= 2:
            d.line([xy(s, v) for s, v in train], fill=TRAIN_COLOUR, width=2)
        for s, v in evals:
            x, y = xy(s, v)
            d.ellipse([x - 4, y - 4, x + 4, y + 4], fill=EVAL_COLOUR)
        d.text((x0, HEIGHT - 16), "step" + ("   (log loss axis)" if log else ""), fill="black")
    d.rectangle([x0, y0, x1, y1], outline="black")
    d.text((WIDTH // 2 - 80, 8), title, fill="black")
    d.line([(x1 - 190, 14), (x1 - 170, 14)], fill=TRAIN_COLOUR, width=2)
    d.text((x1 - 165, 8), "train", fill="black")
    if evals:
        d.ellipse([x1 - 104, 10, x1 - 96, 18], fill=EVAL_COLOUR)
        d.text((x1 - 90, 8), "held-out", fill="black")
    img.save(path)
