"""FSDP2 on a pipelined LM (parallel.modules.language.fsdp = true with pp > 1) equals single-process training.

The LM is cut into 2 stages, each sharded over its 2 data lanes (4 ranks), and runs 4 microbatches of 4 samples
under 1F1B, so each stage interleaves forwards and backwards of different microbatches on sharded blocks (every
backward reduce-scatters into the shards, which add up over the step); interleaved too (virtual_stages = 2: a
4-layer LM in pp2 x v2 = 4 chunks, rank r holding chunks r and r + 2). Checked against one process on the same
global batch: the loss, every gradient and the weights after one clipped AdamW step, max |diff| <= 1e-5 x
max |ref| (fp32), with tied embeddings (the first and last stages' sharded copies get the summed gradient)
and without.
"""

import contextlib
from pathlib import Path

import pytest
import torch

from mimo.config.schema import Config, DataConfig, ModelConfig, ModuleLayoutConfig, OptimConfig, ParallelConfig
from mimo.models.flops import train_step_flops
from mimo.parallel.data import FSDP_REDUCES_UNUSED_PARAMS
from mimo.train.trainer import Trainer
from tests.support.configs import PARITY_OPTIM, tiny_llm
from tests.support.dist import rank_device, run_distributed
from tests.support.parity import grads_then_step, reference_and_parallel_copy, step_matches_reference
from tests.support.tiny_run import metrics, tiny_config

RTOL = 1e-5
S, MICRO, PER_MB = 12, 4, 4


def _config(tied: bool, virtual: int) -> Config:
    lm = ModuleLayoutConfig(pp=2, fsdp=True, virtual_stages=virtual)
    return Config(model=ModelConfig(llm=tiny_llm(layers=3 if virtual == 1 else 2 * virtual, init_std=0.1,
                                                 tie_embeddings=tied)),
                  parallel=ParallelConfig(modules={"language": lm}, microbatches=MICRO),
                  data=DataConfig(global_batch=PER_MB * MICRO), optim=OptimConfig(**PARITY_OPTIM))


def _batch() -> dict:
    g = torch.Generator().manual_seed(3)
    n = PER_MB * MICRO
    ids = torch.randint(1, 60, (n, S), generator=g)
    labels = torch.full((n, S), -100)
    for s in range(n):
        text = list(range(1, S - s % 4))
        labels[s, text] = torch.randint(1, 60, (len(text),), generator=g)
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(S).expand(n, S).contiguous(),
            "modality_inputs": {}}


def _reference(cfg: Config, batch: dict, model) -> dict:
    out = model(batch["input_ids"], labels=batch["labels"])
    loss = out.loss_sum / out.num_tokens
    loss.backward()
    grads, params = grads_then_step(cfg, model)
    return {"loss": loss.item(), "grads": grads, "params": params}


def _case(rank: int, world: int, tied: bool, virtual: int) -> float:
    what = f"LM pp2 x v{virtual} x dp2 fsdp tied {tied}"
    cfg, batch = _config(tied, virtual), _batch()
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda model: _reference(cfg, batch, model))
    assert plan.fsdp_modules() == ["language"], what
    assert all(hasattr(p, "full_tensor") for p in par.language_model.parameters()), f"{what}: every weight sharded"
    pipe = plan.pipeline
    assert pipe.chunks == virtual, f"{what}: the schedule asked for runs"
    if virtual > 1:
        assert len(par.language_model.layers) == virtual, f"{what}: {virtual} chunks of one layer on each rank"
    result = pipe.train_step(par, batch if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
    worst = abs(result.loss - ref["loss"]) / abs(ref["loss"])
    assert worst <= RTOL, f"{what}: loss {result.loss} vs {ref['loss']}"
    assert result.flops == train_step_flops(cfg.model, batch), what
    return max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))


def _cases(rank: int, world: int, virtual: int) -> list[float]:
    return [_case(rank, world, tied, virtual) for tied in (True, False)]


@pytest.mark.skipif(not FSDP_REDUCES_UNUSED_PARAMS, reason="needs FSDP2's set_reduce_scatter_unused_params")
@pytest.mark.parametrize("virtual", [1, 2], ids=["1f1b", "interleaved"])
def test_sharded_pipelined_lm_equals_single_process(virtual):
    worst = run_distributed(_cases, 4, virtual, timeout=600)[0]
    assert max(worst) <= RTOL, worst


LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
RUN = ["--train.steps=4", "--checkpoint.save_every=2", "--checkpoint.keep=2", "--train.eval_every=2",
       "--model.llm.layers=2", "--parallel.microbatches=2"]
PIPE_FSDP = [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=4", f"{LANG}.pp=2",
             f"{LANG}.fsdp=true"]  # encoder on rank 0, the LM's 2 stages x 2 sharded lanes on ranks 1-4
STEP2 = Path("tiny") / "checkpoints" / "step_00000002"


def _train(rank: int, world: int, out: str, overrides: list[str]) -> dict:
    return Trainer(tiny_config(Path(out), *RUN, *overrides)).train()


def _losses(out: Path) -> list[tuple[int, str, float]]:
    """(step, what, value) of every logged training loss, gradient norm and held-out loss."""
    keys = ("loss", "grad_norm", "eval_loss")
    return [(r["step"], k, r[k]) for r in metrics(out) for k in keys if k in r]


def _match(got: list[tuple[int, str, float]], want: list[tuple[int, str, float]]) -> bool:
    return [r[:2] for r in got] == [r[:2] for r in want] and all(
        abs(a[2] - b[2]) <= RTOL * abs(b[2]) for a, b in zip(got, want, strict=True))


@pytest.mark.skipif(not FSDP_REDUCES_UNUSED_PARAMS, reason="needs FSDP2's set_reduce_scatter_unused_params")
def test_sharded_pipelined_run_trains_like_one_process_and_resumes_into_one(tmp_path):
    """`mimo train` end to end on the 5-rank layout (held-out evaluation, DCP checkpoints of the stages' DTensor
    shards, the final evaluation): each step's loss and gradient norm and each held-out loss are the one-process
    run's; its step-2 checkpoint resumes
    in one process and continues as the uninterrupted one-process run."""
    one, pipe, resumed = tmp_path / "one", tmp_path / "pipe", tmp_path / "resumed"
    _train(0, 1, str(one), [])
    summary = run_distributed(_train, 5, str(pipe), PIPE_FSDP, timeout=600)[0]
    assert "eval" in summary
    assert _match(_losses(pipe), _losses(one)), (_losses(pipe), _losses(one))
    _train(0, 1, str(resumed), [f"--checkpoint.resume={pipe / STEP2}"])
    assert _match(_losses(resumed), [r for r in _losses(one) if r[0] >= 2]), (_losses(resumed), _losses(one))
