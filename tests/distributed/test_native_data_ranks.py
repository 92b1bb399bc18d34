"""Native-resolution data on several ranks: images of four sizes, a video, a sample of two images, a text-only one
and a skipped sample train with the single process's losses and gradients on colocated layouts (two data lanes,
plain, cost-balanced or FSDP; the LM under tp2 with sequence parallel, or cp2, with M-RoPE) and a non-colocated one
(the tower on one rank, the LM on another: the LM's rank reads only image headers, the tower's only pixels, and the
pipeline bridge carries each sample's own number of rows), also with Qwen2-VL's vision markers around each item,
and the tower on both ranks beside the LM pp2 over them (its rows crossing to the LM's first stage by sample).
FSDP gives each of the tower's `blocks` its own unit, as it does the LM's and the ViT's `layers`. Every rank's batch
holds every row's placeholders, inputs and FLOPs as the single process's does, whichever rows it reads: on two data
lanes and with the tower's two lanes feeding the LM's three (neither nests in the other)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.fsdp import FSDPModule

from mimo.config.load import load_config
from mimo.models.build import build_model
from mimo.parallel.data import apply_fsdp
from mimo.parallel.grid import Grid
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS, tiny_native_vlm
from tests.support.dist import run_distributed
from tests.support.native_data import TINY, batch_facts, manifest
from tests.support.parity import assert_trains_like, trainer_steps

STEPS = 2
MARKS = ["--model.modalities.images.native.vision_start_token_id=262",
         "--model.modalities.images.native.vision_end_token_id=263"]  # Qwen2-VL's markers around every item
TOWER_THEN_LM = ["--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
                 "--parallel.modules.language.offset=1", "--parallel.modules.language.size=1"]
NON_NESTING = ["--parallel.modules.images.offset=0", "--parallel.modules.images.size=2",
               "--parallel.modules.language.offset=2", "--parallel.modules.language.size=3"]  # dp2 -> dp3
LAYOUTS = {
    "colocated_dp2": [],
    "balanced_dp2": ["--data.balance_lanes=true"],
    "fsdp_dp2": ["--parallel.modules.images.fsdp=true", "--parallel.modules.language.fsdp=true"],
    "lm_cp2": ["--parallel.modules.language.cp=2"],
    "lm_tp2_sp": ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true"],
    "tower_then_lm": TOWER_THEN_LM,
    "tower_then_lm_marked": [*TOWER_THEN_LM, *MARKS],
    "tower_beside_lm_pp2": ["--parallel.modules.language.pp=2", "--model.llm.layers=2", "--parallel.microbatches=2"],
}


def config(out: Path, data: str, *extra: str):
    overrides = [*TINY, f"--data.path={data}", f"--run.out_dir={out}", "--optim.eps=1e-2", "--optim.warmup_steps=0",
                 "--model.llm.kv_heads=2", *extra]
    return load_config(CONFIGS / "native_qwen2_5_vl.toml", overrides)


def _rank(rank: int, world: int, out: str, data: str, extra: list[str]) -> tuple:
    losses, grads = trainer_steps(Trainer(config(Path(out), data, *extra)), STEPS)
    return losses, [{k: v.numpy() for k, v in g.items()} for g in grads]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_native_data_trains_like_one_process(layout, tmp_path):
    data = manifest(tmp_path, several=True)
    model = [x for x in LAYOUTS[layout] if x.startswith("--model.")]  # the same model on one process
    reference = trainer_steps(Trainer(config(tmp_path / "one", data, *model)), STEPS)
    results = run_distributed(_rank, 2, str(tmp_path / layout), data, LAYOUTS[layout], timeout=300)
    losses, grads = results[0]
    assert_trains_like(layout, (losses, grads), reference, 1e-5)


def _facts(rank: int, world: int, out: str, data: str, extra: list[str]) -> tuple:
    return batch_facts(Trainer(config(Path(out), data, *extra)))


@pytest.mark.parametrize("world, extra", [(2, []), (5, NON_NESTING)], ids=["dp2", "tower_dp2_lm_dp3"])
def test_every_rank_holds_every_rows_placeholders(world, extra, tmp_path):
    """A rank that reads neither a row's text nor its pixels still holds its placeholders and grids (from the image
    headers), as the single process does, also where neither module's data lanes nest in the other's."""
    data = manifest(tmp_path, several=True)
    reference = batch_facts(Trainer(config(tmp_path / "one", data, "--data.global_batch=6")))
    for rank, facts in enumerate(run_distributed(_facts, world, str(tmp_path / "l"), data,
                                                 ["--data.global_batch=6", *extra], timeout=300)):
        assert facts == reference, f"rank {rank} of {world}"


def _native_units(rank: int, world: int) -> list[bool]:
    model = build_model(tiny_native_vlm(layers=2))
    apply_fsdp(model.modality_submodules["images"], Grid(dp=world).build("dp").device_mesh("dp"))
    tower = next(iter(model.modality_submodules["images"].encoders.values()))
    return [isinstance(block, FSDPModule) for block in tower.blocks.values()]


def test_fsdp_shards_each_native_block_as_its_own_unit():
    assert run_distributed(_native_units, 2, timeout=120) == [[True, True]] * 2
