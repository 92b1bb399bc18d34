"""A modality the step never feeds is left as one process leaves it, on every layout.

The Out path demo (configs/demo_text_to_image.toml shrunk) builds an image encoder that never sees an image. One
process leaves its gradients None, so AdamW does not move it; a layout's means of keeping collectives in step
(FSDP2 reduce-scattering zeros for a unit's unused parameters, a stand-in forward on an encoder's ranks) gave it
zero gradients, and AdamW's weight decay moved it (4e-5 relative after 4 steps). Trained by `Trainer` for three
steps against one process on the same global batches: every step's loss and every weight after the last step
within 1e-5 relative, the encoder's and input projection's weights exactly the one process's. Layouts:
- images FSDP2 over dp2 beside LM dp2 (the smallest that showed it), and the issue's layout: images FSDP2 over
  dp8 beside LM tp2 x dp4 FSDP2;
- images replicated over dp2 (its bucketed all-reduce already kept a gradient no rank had None);
- pipelined: images FSDP2 over dp2 on their own ranks beside LM dp2 (raised "missing pixel_values" before: the
  stand-in had no input to copy the shape of), and images replicated there.
Under precision.master_weights (MasterAdamW stepped a parameter without a gradient on zeros, so weight decay moved
it even on one process), on one process, images replicated over dp2 (their fp32 state sharded ZeRO-1 over the two
lanes) and images FSDP2 over dp2 (torch's AdamW over the fp32 shards): the encoder's and input projection's fp32
master weights are exactly their initial values (the fp32 one-process run's) and their step counts 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mimo.config.load import load_config
from mimo.train.trainer import Trainer
from tests.support.configs import T2I, TINY_T2I
from tests.support.dist import run_distributed
from tests.support.master_weights import MASTER, full_master_weights
from tests.support.parity import assert_weights_like

RTOL = 1e-5
STEPS = 3
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
RUN = ["--run.name=tiny", "--metrics.progress=false", "--metrics.tensorboard=false", "--train.log_every=1",
       "--train.threads=1", "--optim.warmup_steps=1", "--optim.eps=1e-2"]
OUT_PATH = [*TINY_T2I, *RUN, "--model.llm.heads=4", "--model.llm.kv_heads=2", "--data.train_samples=32",
            "--data.eval_samples=2", "--data.global_batch=8"]
APART = [f"{IMG}.size=2", f"{LANG}.offset=2", f"{LANG}.size=2"]
CASES = {
    "images_fsdp_dp2_lm_dp2": (2, [f"{IMG}.fsdp=true"]),
    "images_fsdp_dp8_lm_tp2_dp4_fsdp": (8, [f"{IMG}.fsdp=true", f"{LANG}.tp=2", f"{LANG}.fsdp=true"]),
    "images_dp2_lm_dp2": (2, []),
    "pipelined_images_fsdp_dp2_lm_dp2": (4, [*APART, f"{IMG}.fsdp=true"]),
    "pipelined_images_dp2_lm_dp2": (4, APART),
}
UNFED = (".encoders.", ".input_projections.")
MASTER_CASES = {"one_process": (1, []), "images_dp2_lm_dp2": (2, []),
                "images_fsdp_dp2_lm_dp2": (2, [f"{IMG}.fsdp=true"])}


def _train(out: Path, *layout: str) -> tuple[list[float], dict]:
    trainer = Trainer(load_config(T2I, [*OUT_PATH, f"--run.out_dir={out}", *layout]))
    losses = [trainer.train_step(step)["loss"] for step in range(STEPS)]
    params = trainer.plan.gather_full(trainer.model)
    return losses, {n: p.numpy() for n, p in params.items()}


def _rank(rank: int, world: int, out: str, layout: list[str]) -> tuple[list[float], dict]:
    return _train(Path(out), *layout)


def _masters(rank: int, world: int, out: str, layout: list[str]) -> tuple[dict, list[float]]:
    """After STEPS master_weights steps: every fp32 master weight, whole, and the step counts of this rank's
    MasterAdamW parameters that the batches never feed."""
    trainer = Trainer(load_config(T2I, [*OUT_PATH, f"--run.out_dir={out}", *MASTER, *layout]))
    for step in range(STEPS):
        trainer.train_step(step)
    unfed = {id(p) for p in trainer.model.unfed_parameters(frozenset())}
    counts = [float(n) for _, opt in trainer.optimizer.parts for p, n in zip(opt.params, opt.steps) if id(p) in unfed]
    return {n: t.numpy() for n, t in full_master_weights(trainer).items()}, counts


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[float], dict]:
    threads = torch.get_num_threads()
    yield _train(tmp_path_factory.mktemp("ref"))
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", list(CASES))
def test_an_unfed_encoder_is_left_as_one_process_leaves_it(reference, tmp_path, case):
    world, layout = CASES[case]
    losses, weights = run_distributed(_rank, world, str(tmp_path), layout, timeout=600)[0]
    ref_losses, ref_weights = reference
    for step, (got, want) in enumerate(zip(losses, ref_losses, strict=True)):
        assert abs(got - want) <= RTOL * abs(want), f"{case} step {step}: loss {got} vs single-process {want}"
    assert_weights_like(case, weights, ref_weights, RTOL)
    unfed = [n for n in weights if any(part in n for part in UNFED)]
    assert unfed, case
    for name in unfed:
        assert (torch.as_tensor(weights[name]) == torch.as_tensor(ref_weights[name])).all(), f"{case}: {name} moved"


@pytest.mark.parametrize("case", list(MASTER_CASES))
def test_master_weights_leave_an_unfed_encoder_as_torch_adamw_does(reference, tmp_path, case):
    world, layout = MASTER_CASES[case]
    ranks = [_masters(0, 1, str(tmp_path), layout)] if world == 1 else \
        run_distributed(_masters, world, str(tmp_path), layout, timeout=600)
    masters, ref_weights = ranks[0][0], reference[1]
    unfed = [n for n in masters if any(part in n for part in UNFED)]
    assert unfed, case
    for name in unfed:
        assert (torch.as_tensor(masters[name]) == torch.as_tensor(ref_weights[name])).all(), f"{case}: {name} moved"
    assert any(counts for _, counts in ranks) or "fsdp" in case, case
    for rank, (_, counts) in enumerate(ranks):
        assert all(n == 0 for n in counts), (case, rank, counts)
