"""Lane imbalance (max / mean of the data lanes' step costs) before and after `data.balance_lanes`, on CPU.

The mix: per 8 samples, 1 with a large image and 7 with a small one, over 4 data lanes, rows shuffled (a seeded
draw per trial). Three cost models:

- `native`: images at their own size on a Qwen2.5-VL-7B-shaped native_vision tower (32 layers, hidden 1280, MLP
  3420, patch 14, 112-pixel windows, full attention in layers 7, 15, 23 and 31) over a 1008 x 1008 image (a 72 x 72
  patch grid) or a 224 x 224 one (16 x 16), its merger's tokens (patches / 4) plus 128 text tokens into a
  Qwen2.5-7B-shaped LM; per row `native_flops` (mimo/models/flops.py, what `mimo train` balances by) plus `lm_flops`
  over the row. Two LM terms: `padded`, every row as long as the longest (1,424 tokens), as `mimo train`'s rows
  are; `own`, each row as long as its tokens (what packing or variable-length rows would give).
- `anyres`: LLaVA-NeXT-7B-shaped, a CLIP ViT-L/14-336 tower tiling at LLaVA-NeXT's five pinpoints into a
  Vicuna-7B-shaped LM, a 672 x 672 image (5 tiles, 2,928 rows) or a 336 x 336 one (3 tiles, 1,176 rows) plus
  128 text tokens; per row `anyres_flops` (what `mimo train` balances an anyres image by: its tiles) plus
  `lm_flops`, rows `padded` to the longest or at their `own` length as for `native`.
- `fixed`: what `mimo train` balances today: preset `small` (a 336 x 336 ViT, one image size), rows of one
  length, the large sample being 3 images and the small ones 1; costs from `LaneBalancer` on real batches.

    python -m benchmarks.bench_lanes   # native, anyres: 200 trials per shape; fixed: 20 (real batches, 1.4 MB each)
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from benchmarks.workload import MODALITY, images_seq_len, load_preset, model_config
from mimo.config.schema import LLMConfig, ModalityConfig, NativeViTConfig, ViTConfig
from mimo.data.lanes import LaneBalancer, balanced_order, lane_imbalance
from mimo.models.anyres import anyres_rows
from mimo.models.flops import anyres_flops, lm_flops, native_flops

LANES = 4
QWEN25_VIT = NativeViTConfig(family="qwen2_5_vl", patch=14, merge=2, hidden=1280, layers=32, heads=16, mlp=3420,
                             window=112, full_attention_layers=[7, 15, 23, 31])
QWEN25_LM = LLMConfig(vocab=152064, hidden=3584, layers=28, heads=28, kv_heads=4, mlp=18944)
TEXT_TOKENS = 128
LLAVA_NEXT = ModalityConfig(vit=ViTConfig(image=336, patch=14, hidden=1024, layers=24, heads=16, mlp=4096),
                            anyres_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]])
VICUNA_7B = LLMConfig(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, mlp=11008)


def native_cost(side: int, padded: bool) -> int:
    """Forward FLOPs of a sample with one `side` x `side` image and TEXT_TOKENS of text (see the docstring)."""
    grid = side // QWEN25_VIT.patch
    tokens = grid * grid // 4
    row = (1008 // QWEN25_VIT.patch) ** 2 // 4 + TEXT_TOKENS if padded else tokens + TEXT_TOKENS
    return native_flops(QWEN25_VIT, (1, grid, grid), QWEN25_LM.hidden) + lm_flops(QWEN25_LM, row)


def anyres_cost(side: int, padded: bool) -> int:
    """Forward FLOPs of a sample with one `side` x `side` anyres image and TEXT_TOKENS of text (see the docstring)."""
    vit, pinpoints = LLAVA_NEXT.vit, LLAVA_NEXT.anyres_grid_pinpoints
    rows = anyres_rows((672, 672) if padded else (side, side), vit.image, vit.patch, pinpoints, 0, vit.tokens_per_image)
    return anyres_flops(LLAVA_NEXT, (side, side), VICUNA_7B.hidden) + lm_flops(VICUNA_7B, rows + TEXT_TOKENS)


def mix(rows: int, large: int, small: int, rng: random.Random) -> list[int]:
    """`rows` costs, one large per 8, shuffled."""
    costs = [large if i % 8 == 0 else small for i in range(rows)]
    rng.shuffle(costs)
    return costs


def figures(trials: list[tuple[float, float]]) -> str:
    before, after = zip(*trials)
    return (f"before mean {statistics.mean(before):.3f} max {max(before):.3f} | "
            f"after mean {statistics.mean(after):.3f} max {max(after):.3f}")


def shuffled(rows: int, microbatches: int, trials: int, large: int, small: int) -> str:
    """The lanes' figures over `trials` mixes of `large` and `small` samples, and with several microbatches the
    bins' (one lane's share of one microbatch)."""
    rng = random.Random(0)
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
    costs = {"native": lambda padded: (native_cost(1008, padded), native_cost(224, padded)),
             "anyres": lambda padded: (anyres_cost(672, padded), anyres_cost(336, padded))}
    for kind, cost in costs.items():
        for padded in (True, False):
            large, small = cost(padded)
            print(f"{kind} {'padded' if padded else 'own'} rows: large / small sample cost {large / small:.2f}")
    for rows, microbatches in ((8, 1), (32, 1), (32, 4), (64, 1)):
        shape = f"{rows} rows, {LANES} lanes x {microbatches} microbatch(es)"
        for kind, cost in costs.items():
            for padded in (True, False):
                name = "padded" if padded else "own   "
                print(f"{kind} {name} {shape}: {shuffled(rows, microbatches, args.trials, *cost(padded))}")
        print(f"fixed  {shape}: {fixed(rows, microbatches, max(1, args.trials // 10))}")


if __name__ == "__main__":
    main()
