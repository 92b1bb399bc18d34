"""Lane imbalance (max / mean of the data lanes' step costs) before and after `data.balance_lanes`, on CPU.

The mix: per 8 samples, 1 with a large image and 7 with a small one, over 4 data lanes, rows shuffled (a seeded
draw per trial). Two cost models:

- `native`: images at their own size, as a Qwen2-VL-class tower sees them (the model issue #31 builds): a
  Qwen2.5-VL-7B-shaped ViT (32 layers, hidden 1280, MLP 3420, patch 14, full attention in every layer) over a
  1008 x 1008 image (5184 patches) or a 224 x 224 one (256 patches), the 2x2 merger's tokens (patches / 4) plus
  128 text tokens into a Qwen2.5-7B-shaped LM, each row as long as its tokens; mimo/models/flops.py's
  `encoder_flops` and `lm_flops` per row. This exercises the assignment (mimo/data/lanes.py `balanced_order`)
  on costs today's encoders cannot produce yet.
- `fixed`: what `mimo train` balances today: preset `small` (a 336 x 336 ViT, one image size), rows of one
  length, the large sample being 3 images and the small ones 1; costs from `LaneBalancer` on real batches.

    python -m benchmarks.bench_lanes     # native: 200 trials per shape; fixed: 20 (real batches, 1.4 MB an image)
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from benchmarks.workload import MODALITY, images_seq_len, load_preset, model_config
from mimo.config.schema import LLMConfig
from mimo.data.lanes import LaneBalancer, balanced_order, lane_imbalance
from mimo.models.flops import block_params, encoder_flops, lm_flops, projector_flops

LANES = 4
QWEN25_VIT = dict(layers=32, hidden=1280, mlp=3420, patch=14, channels=3)
QWEN25_LM = LLMConfig(vocab=152064, hidden=3584, layers=28, heads=28, kv_heads=4, mlp=18944)
TEXT_TOKENS = 128


def native_cost(side: int) -> int:
    """Forward FLOPs of a sample with one `side` x `side` image and TEXT_TOKENS of text (see the docstring)."""
    v = QWEN25_VIT
    patches = (side // v["patch"]) ** 2
    params = block_params(v["hidden"], v["mlp"], v["layers"]) + v["channels"] * v["patch"] ** 2 * v["hidden"]
    tokens = patches // 4
    merger = projector_flops(4 * v["hidden"], QWEN25_LM.hidden, tokens)
    return encoder_flops(params, patches, v["layers"], v["hidden"]) + merger + lm_flops(QWEN25_LM, tokens + TEXT_TOKENS)


def mix(rows: int, large: int, small: int, rng: random.Random) -> list[int]:
    """`rows` costs, one large per 8, shuffled."""
    costs = [large if i % 8 == 0 else small for i in range(rows)]
    rng.shuffle(costs)
    return costs


def figures(trials: list[tuple[float, float]]) -> str:
    before, after = zip(*trials)
    return (f"before mean {statistics.mean(before):.3f} max {max(before):.3f} | "
            f"after mean {statistics.mean(after):.3f} max {max(after):.3f}")


def native(rows: int, microbatches: int, trials: int) -> str:
    """The lanes' figures, and with several microbatches the bins' (one lane's share of one microbatch)."""
    rng = random.Random(0)
    large, small = native_cost(1008), native_cost(224)
    lanes, bins = [], []
    for _ in range(trials):
        costs = mix(rows, large, small, rng)
        balanced = [costs[i] for i in balanced_order(costs, LANES, microbatches)]
        lanes.append(tuple(lane_imbalance(c, LANES, microbatches) for c in (costs, balanced)))
        bins.append(tuple(lane_imbalance(c, LANES * microbatches, 1) for c in (costs, balanced)))
    return figures(lanes) + (f"; bins: {figures(bins)}" if microbatches > 1 else "")


def fixed_batch(counts: list[int], p: dict) -> dict:
    """A preset-`small` global batch whose rows hold `counts` images (zeros: the cost reads shapes only)."""
    side = p["vision"]["image"]
    pixels = torch.zeros(sum(counts), 3, side, side)
    return {"input_ids": torch.zeros(len(counts), images_seq_len(p, 3), dtype=torch.long),
            "modality_inputs": {MODALITY: {"vit": {"pixel_values": pixels}}},
            "modality_counts": {MODALITY: torch.tensor(counts)}}


def fixed(rows: int, microbatches: int, trials: int) -> str:
    p = load_preset("small")
    balancer = LaneBalancer(model_config(p), LANES, microbatches)
    rng = random.Random(0)
    out = []
    for _ in range(trials):
        _, f = balancer(fixed_batch(mix(rows, 3, 1, rng), p))
        out.append((f["lane_imbalance_before"], f["lane_imbalance"]))
    return figures(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    print(f"native cost ratio large / small sample: {native_cost(1008) / native_cost(224):.1f}")
    for rows, microbatches in ((8, 1), (32, 1), (32, 4), (64, 1)):
        shape = f"{rows} rows, {LANES} lanes x {microbatches} microbatch(es)"
        print(f"native {shape}: {native(rows, microbatches, args.trials)}")
        print(f"fixed  {shape}: {fixed(rows, microbatches, max(1, args.trials // 10))}")


if __name__ == "__main__":
    main()
