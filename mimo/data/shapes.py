"""The built-in demo set: small rendered images of coloured shapes, with questions about them.

Each image holds one to three copies of one shape in one colour. A sample asks for the colour, the
shape or the count. Answering needs the image (the question alone says nothing), and no single
answer covers more than about 11% of the questions. Generated deterministically from a seed, so
nothing is downloaded and every rank can build the same set.

A sample may hold several images (`images=(lo, hi)`: each sample draws its count from lo..hi): all of
them renderings of the same shapes (own jitter and shade), so a question has one answer; a sample with
no image answers every question with "none".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

COLORS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 80, 230), "yellow": (230, 210, 40)}
SHAPES = ("circle", "square", "triangle", "cross")
COUNTS = ("one", "two", "three")
QUESTIONS = {"color": "what color?", "shape": "what shape?", "count": "how many?"}
NO_IMAGE = "none"
"""The answer of a sample without an image."""
IMAGE_SIZE = 32


@dataclass
class Sample:
    images: list[np.ndarray]  # uint8 [H, W, 3] each; none for a text-only sample
    question: str
    answer: str


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float,
               fill: tuple[int, int, int]) -> None:
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    else:
        w = max(1.0, r / 3)
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)


def render(shape: str, color: str, count: int, rng: np.random.Generator, size: int = IMAGE_SIZE) -> np.ndarray:
    """One image: `count` shapes in distinct cells of a 2x2 grid, jittered, slightly varied shade."""
    img = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(0, 40, 3)))
    draw = ImageDraw.Draw(img)
    cell = size / 2
    base = np.array(COLORS[color])
    for c in rng.choice(4, size=count, replace=False):
        r = cell * rng.uniform(0.28, 0.38)
        cx = (c % 2) * cell + cell / 2 + rng.uniform(-1.5, 1.5)
        cy = (c // 2) * cell + cell / 2 + rng.uniform(-1.5, 1.5)
        shade = np.clip(base + rng.integers(-25, 26, 3), 0, 255)
        draw_shape(draw, shape, cx, cy, r, tuple(int(v) for v in shade))
    return np.asarray(img, dtype=np.uint8)


def make_samples(n: int, seed: int, images: tuple[int, int] = (1, 1)) -> list[Sample]:
    """`n` samples of `images[0]..images[1]` images each; question kinds cycle so the three kinds are
    balanced. One image each (the default) draws exactly what it always drew."""
    rng = np.random.default_rng(seed)
    kinds = list(QUESTIONS)
    lo, hi = images
    out = []
    for i in range(n):
        k = int(rng.integers(lo, hi + 1)) if lo != hi else lo
        shape = SHAPES[rng.integers(len(SHAPES))]
        color = list(COLORS)[rng.integers(len(COLORS))]
        count = int(rng.integers(1, 4))
        drawn = [render(shape, color, count, rng) for _ in range(k)]
        kind = kinds[i % len(kinds)]
        answer = {"color": color, "shape": shape, "count": COUNTS[count - 1]}[kind] if k else NO_IMAGE
        out.append(Sample(drawn, QUESTIONS[kind], answer))
    return out


def image_tensor_values(image: np.ndarray) -> np.ndarray:
    """uint8 HWC -> float32 CHW in [-1, 1]."""
    return (image.astype(np.float32).transpose(2, 0, 1) / 127.5) - 1.0
