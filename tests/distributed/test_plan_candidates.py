"""Every candidate `mimo plan` lists for demo_vlm, demo_text_to_image and demo_avlm at 4 and 8 ranks (colocated
pipelined ones included: every encoder on every rank, the LM pipelined over the same ranks), and every
expert-parallel one it lists for demo_moe_vlm at 4 (beside its plain dp4) and every interleaved one it lists for a
6-layer demo_vlm at 8 (beside its plain 1F1B twin), trains one step on gloo:
the planner keeps only layouts that pass the gate, and the gate refuses whatever a later step would (a layout
listed here that died in its first step would fail this test, naming it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.config.load import load_config
from mimo.planner.candidates import label, make_plan, with_modules
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS, T2I
from tests.support.dist import run_distributed

GPUS = (4, 8)
DEMOS = {"demo_vlm": CONFIGS / "demo_vlm.toml", "demo_text_to_image": T2I, "demo_avlm": CONFIGS / "demo_avlm.toml"}
# Smaller data sets build faster and change no layout rule; the model, batch and microbatches stay the demo's.
SHRINK = ["--data.train_samples=64", "--data.eval_samples=2", "--metrics.progress=false", "--metrics.tensorboard=false",
          "--train.threads=1", "--parallel.timeout_s=120"]


def _candidates(config: Path, gpus: int, extra: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    plan = make_plan(load_config(config, [*SHRINK, *extra]), gpus, 80.0)
    return [(label(row.layout, row.modules), row.modules) for row in plan.rows]


def _steps(rank: int, world: int, config: Path, out: str, candidates: list[tuple[str, dict]],
           extra: tuple[str, ...] = ()) -> list[float]:
    losses = []
    for i, (name, modules) in enumerate(candidates):
        cfg = with_modules(load_config(config, [*SHRINK, *extra, f"--run.out_dir={out}/{i}"]), modules)
        try:
            losses.append(Trainer(cfg).train_step(0)["loss"])
        except Exception as e:
            raise RuntimeError(f"candidate {i + 1} ({name}) failed its first step: {type(e).__name__}: {e}") from e
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("gpus", GPUS)
@pytest.mark.parametrize("demo", list(DEMOS))
def test_every_planned_candidate_trains_a_step(tmp_path, demo, gpus):
    candidates = _candidates(DEMOS[demo], gpus)
    assert len(candidates) >= 4, candidates
    # colocated pipelined candidates among them: the LM pipelined over every rank (size 0), as the encoders
    assert any(m["language"].pp > 1 and not m["language"].size for _, m in candidates), candidates
    losses = run_distributed(_steps, gpus, DEMOS[demo], str(tmp_path), candidates, timeout=900)[0]
    assert len(losses) == len(candidates)
    # Every layout computes one process's step: the same first loss everywhere.
    assert max(losses) - min(losses) <= 1e-5 * abs(losses[0]), dict(zip((n for n, _ in candidates), losses))


@pytest.mark.slow
def test_every_planned_expert_parallel_candidate_trains_a_step(tmp_path):
    config = CONFIGS / "demo_moe_vlm.toml"
    candidates = [(name, m) for name, m in _candidates(config, 4) if m["language"].ep > 1 or name == "dp4"]
    assert {m["language"].ep for _, m in candidates} == {1, 2, 4}, candidates
    losses = run_distributed(_steps, 4, config, str(tmp_path), candidates, timeout=900)[0]
    assert len(losses) == len(candidates)
    assert max(losses) - min(losses) <= 1e-5 * abs(losses[0]), dict(zip((n for n, _ in candidates), losses))


# demo_vlm with 6 LM layers and 6 microbatches of 24 samples: its 6-rank LM split is pp3 dp2, which the planner
# lists again interleaved (pp3 x v2 = 6 model chunks).
INTERLEAVABLE = ("--model.llm.layers=6", "--parallel.microbatches=6", "--data.global_batch=24")


@pytest.mark.slow
def test_every_planned_interleaved_candidate_trains_a_step(tmp_path):
    config = CONFIGS / "demo_vlm.toml"
    rows = _candidates(config, 8, INTERLEAVABLE)
    interleaved = [(name, m) for name, m in rows if m["language"].virtual_stages > 1]
    plain = [(name, m) for name, m in rows if any(name == n.replace(" v2", "") for n, _ in interleaved)]
    assert interleaved and len(plain) == len(interleaved), rows
    candidates = plain + interleaved
    losses = run_distributed(_steps, 8, config, str(tmp_path), candidates, INTERLEAVABLE, timeout=900)[0]
    assert max(losses) - min(losses) <= 1e-5 * abs(losses[0]), dict(zip((n for n, _ in candidates), losses))
