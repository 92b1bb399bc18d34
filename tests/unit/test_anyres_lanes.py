"""Balanced data lanes (mimo/data/lanes.py) on an anyres modality: an image costs its tiles (hand counts), and a JSONL
batch built imbalanced is balanced with each image's tiles, sizes and placeholders moving with its row, so its two
lanes hold what the model needs and together give the unbalanced batch's loss."""

from __future__ import annotations

import pytest
import torch

from mimo.data.batching import split_microbatches
from mimo.data.checks import check_batch
from mimo.data.lanes import LaneBalancer, lane_loads, row_costs, take_rows
from mimo.models.flops import lm_flops, projector_flops, vit_flops
from mimo.models.step_hints import forward_args
from mimo.train.trainer import Trainer
from tests.support.anyres_data import jsonl
from tests.support.anyres_run import ANYRES
from tests.support.tiny_run import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_anyres_image_costs_its_tiles(tmp_path):
    """At [[16, 32], [32, 16], [32, 32]] with 16-pixel tiles (tests.unit.test_flops' hand counts): 33 x 33 -> 5
    tiles, 20 x 40 -> 3, 8 x 8 -> 3; the zero padding to the most tiles (5) costs nothing, an untiled image
    (mimo.models.anyres.tiled_images) one tile, and its flag moves with its row."""
    cfg = tiny_config(tmp_path, *ANYRES).model
    m = cfg.modalities["images"]
    tile = vit_flops(m.vit) + projector_flops(m.vit.hidden, cfg.llm.hidden, m.vit.tokens_per_image)
    inputs = {"pixel_values": torch.zeros(3, 5, 3, 16, 16), "image_sizes": torch.tensor([[33, 33], [20, 40], [8, 8]])}
    batch = {"input_ids": torch.zeros(3, 40, dtype=torch.long), "modality_inputs": {"images": {"vit": inputs}},
             "modality_counts": {"images": torch.tensor([0, 2, 1])}}
    lm = lm_flops(cfg.llm, 40)
    assert row_costs(cfg, batch) == [lm, lm + (5 + 3) * tile, lm + 3 * tile]
    inputs["tiled"] = torch.tensor([True, False, True])  # OneVision's image beside another: its overview tile alone
    assert row_costs(cfg, batch) == [lm, lm + (5 + 1) * tile, lm + 3 * tile]
    out = take_rows(batch, [2, 1, 0])
    assert out["modality_inputs"]["images"]["vit"]["tiled"].tolist() == [True, True, False]
    assert row_costs(cfg, out) == [lm + 3 * tile, lm + (5 + 1) * tile, lm]


def imbalanced_batch(tmp_path) -> tuple[Trainer, dict]:
    """Rows of the manifest's two-image sample (20 x 40 and 40 x 24: 3 + 5 tiles), 33 x 33 (5), 20 x 40 (3) and the
    text-only sample: in order lane 0 runs 13 tiles and lane 1 3."""
    trainer = Trainer(tiny_config(tmp_path, *jsonl(tmp_path), "--data.balance_lanes=true"))
    reader = trainer.data.reader(trainer.data)
    items = [reader[(row, line, True, frozenset({"images"}))] for row, line in enumerate([5, 3, 0, 6])]
    return trainer, trainer.data._assemble(items, 4, torch.zeros(4, dtype=torch.bool))


def test_balancing_moves_tiles_with_their_rows(tmp_path):
    """LPT over 2 lanes of 2 rows: 8 tiles -> lane 0, 5 -> lane 1, 3 -> lane 1, 0 -> lane 0, so rows [0, 3, 1, 2] and
    8 tiles a lane; the heaviest lane's cost drops, and each image keeps its tiles, size and zero padding (the
    text-only row moved between the images, so the images keep their order)."""
    trainer, batch = imbalanced_batch(tmp_path)
    cfg = trainer.cfg.model
    before = row_costs(cfg, batch)
    out, figures = LaneBalancer(cfg, 2, 1)(batch)
    after = row_costs(cfg, out)
    assert after == [before[i] for i in (0, 3, 1, 2)]
    assert max(lane_loads(after, 2, 1)) < max(lane_loads(before, 2, 1))
    assert figures["lane_imbalance"] < figures["lane_imbalance_before"]
    check_batch(trainer.model, out)
    old, new = (b["modality_inputs"]["images"]["vit"] for b in (batch, out))
    assert new["image_sizes"].tolist() == [[20, 40], [40, 24], [33, 33], [20, 40]]
    assert torch.equal(new["image_sizes"], old["image_sizes"]) and torch.equal(new["pixel_values"], old["pixel_values"])
    assert out["modality_counts"]["images"].tolist() == [2, 0, 1, 1]
    assert torch.equal(out["input_ids"], batch["input_ids"][[0, 3, 1, 2]])


def test_a_lane_reorder_regroups_images_of_different_tiles(tmp_path):
    """Rows reversed: images [3], [2], [0, 1] in that order, each with its own tiles (3, 5, then 3 and 5) and its
    zero padding to the batch's most tiles."""
    trainer, batch = imbalanced_batch(tmp_path)
    out = take_rows(batch, [3, 2, 1, 0])
    check_batch(trainer.model, out)
    old, new = (b["modality_inputs"]["images"]["vit"] for b in (batch, out))
    assert torch.equal(new["image_sizes"], old["image_sizes"][[3, 2, 0, 1]])
    assert torch.equal(new["pixel_values"], old["pixel_values"][[3, 2, 0, 1]])
    assert [int(p.flatten(1).any(1).sum()) for p in new["pixel_values"]] == [3, 5, 3, 5]


def test_each_balanced_lane_holds_its_rows_tiles(tmp_path):
    """The balanced batch split into its two lanes as a dp2 rank splits it (mimo.data.batching): lane 0 holds the
    two-image row's 3 + 5 tiles, lane 1 the 5- and 3-tile images, and the lanes' loss sums add up to the batch's
    in its own order within 1e-5 relative."""
    trainer, batch = imbalanced_batch(tmp_path)
    out, _ = LaneBalancer(trainer.cfg.model, 2, 1)(batch)

    def loss(b: dict) -> torch.Tensor:
        with torch.no_grad():
            return trainer.model(**forward_args({k: v for k, v in b.items() if k != "modality_counts"})).loss_sum

    lanes = [split_microbatches(out, 1, {"language": (i, 2), "images": (i, 2)})[0] for i in range(2)]
    sizes = [lane["modality_inputs"]["images"]["vit"]["image_sizes"].tolist() for lane in lanes]
    assert sizes == [[[20, 40], [40, 24]], [[33, 33], [20, 40]]]
    whole, parts = loss(batch), [loss(lane) for lane in lanes]
    assert abs(sum(parts) - whole) <= 1e-5 * abs(whole)
