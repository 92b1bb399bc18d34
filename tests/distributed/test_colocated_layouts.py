"""Colocated layouts whose encoder and LM DP degrees differ, trained by `Trainer` for two steps against one
process (losses and every gradient within 1e-5 relative):

- the Out path (text -> image, configs/demo_text_to_image.toml shrunk) on images dp4 + LM tp2 x dp2, images
  tp2 x dp2 + LM dp4 and images dp8 + LM tp2 x dp4: the LM's states at generation tokens cross to the
  modality's lanes, are decoded there and come back for the loss (step 0 raised "has no input on this rank"
  before);
- the Out path with the LM's sequence sharded: LM tp2 + SP beside images dp4, LM cp2 x dp2 beside images
  tp2 x dp2 (equal DP, no bridge), LM cp2 x tp2 + SP beside images dp4: the states are gathered whole
  (`ModelRuntime.gather_sequence`) before the generation tokens are picked (the gate refused these before);
- DP degrees that do not divide each other: encoder tp2 x dp3 beside LM tp3 x dp2 on 6 ranks, on the shapes
  demo with 0..3 images per sample (LM lane 0 takes encoder lane 0 and half of lane 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.schema import Config
from mimo.train.trainer import Trainer
from tests.support.configs import T2I, TINY_T2I
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, trainer_steps
from tests.support.tiny_run import tiny_config

RTOL = 1e-5
STEPS = 2
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
RUN = ["--run.name=tiny", "--metrics.progress=false", "--metrics.tensorboard=false", "--train.log_every=1",
       "--train.threads=1", "--optim.warmup_steps=1", "--optim.eps=1e-2"]
OUT_PATH = [*TINY_T2I, *RUN, "--model.llm.heads=4", "--model.llm.kv_heads=2", "--data.train_samples=32",
            "--data.eval_samples=2", "--data.global_batch=8"]
NOT_DIVIDING = ["--model.llm.heads=6", "--model.llm.kv_heads=3", "--model.llm.hidden=48", "--model.llm.vocab=273",
                "--model.llm.mlp=66", "--model.llm.layers=2", "--data.global_batch=12", "--optim.eps=1e-2",
                "--data.min_images_per_sample=0", "--data.images_per_sample=3"]
CASES = {
    "out_images_dp4_lm_tp2_dp2": ("out", 4, [f"{LANG}.tp=2"]),
    "out_images_tp2_dp2_lm_dp4": ("out", 4, [f"{IMG}.tp=2"]),
    "out_images_dp8_lm_tp2_dp4": ("out", 8, [f"{LANG}.tp=2"]),
    "out_images_dp4_lm_tp2_sp_dp2": ("out", 4, [f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true"]),
    "out_images_tp2_dp2_lm_cp2_dp2": ("out", 4, [f"{IMG}.tp=2", f"{LANG}.cp=2"]),
    "out_images_dp4_lm_cp2_tp2_sp": ("out", 4, [f"{LANG}.cp=2", f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true"]),
    "images_tp2_dp3_lm_tp3_dp2": ("shapes", 6, [f"{IMG}.tp=2", f"{LANG}.tp=3"]),
}


def _config(kind: str, out: Path, *layout: str) -> Config:
    if kind == "out":
        return load_config(T2I, [*OUT_PATH, f"--run.out_dir={out}", *layout])
    return tiny_config(out, *NOT_DIVIDING, *layout)


def _train(kind: str, out: Path, *layout: str) -> tuple[list[float], list[dict]]:
    losses, grads = trainer_steps(Trainer(_config(kind, out, *layout)), STEPS)
    return losses, [{n: g.numpy() for n, g in step.items()} for step in grads]


def _rank(rank: int, world: int, kind: str, out: str, layout: list[str]) -> tuple[list[float], list[dict]]:
    return _train(kind, Path(out), *layout)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, tuple[list[float], list[dict]]]:
    threads = torch.get_num_threads()
    yield {kind: _train(kind, tmp_path_factory.mktemp(kind)) for kind in ("out", "shapes")}
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", list(CASES))
def test_colocated_layout_trains_like_single_process(references, tmp_path, case):
    kind, world, layout = CASES[case]
    run = run_distributed(_rank, world, kind, str(tmp_path), layout, timeout=600)[0]
    assert_trains_like(case, run, references[kind], RTOL)
    if kind == "out":
        assert any("decoders" in name and abs(g).max() > 0 for name, g in run[1][0].items())
