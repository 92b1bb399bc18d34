"""A loss-curve PNG drawn with Pillow (no plotting library needed)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw


def plot_curve(steps: list[int], values: list[float], path: str | Path, title: str = "training loss") -> None:
    w, h, m = 640, 400, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    d.rectangle([m, m // 2, w - m // 2, h - m], outline="black")
    if len(values) >= 2:
        lo, hi = min(values), max(values)
        hi = hi if hi > lo else lo + 1.0
        s0, s1 = steps[0], max(steps[-1], steps[0] + 1)

        def xy(s: int, v: float) -> tuple[float, float]:
            x = m + (s - s0) / (s1 - s0) * (w - 1.5 * m)
            y = (h - m) - (v - lo) / (hi - lo) * (h - 1.5 * m)
            return x, y

        d.line([xy(s, v) for s, v in zip(steps, values)], fill=(30, 90, 200), width=2)
        d.text((4, m // 2), f"{hi:.3g}", fill="black")
        d.text((4, h - m - 10), f"{lo:.3g}", fill="black")
        d.text((m, h - m + 6), f"step {s0}", fill="black")
        d.text((w - 2 * m, h - m + 6), f"step {steps[-1]}", fill="black")
    d.text((w // 2 - 40, 6), title, fill="black")
    img.save(path)
