"""FSDP2 on an interleaved LM pipeline (parallel.modules.language.fsdp = true with virtual_stages = 2) equals
single-process training.

The 4-layer LM is cut into pp2 x v2 = 4 model chunks, rank r of the pipeline holding chunks r and r + 2, each
rank's layers sharded over its 2 data lanes (4 ranks), and runs 4 microbatches of 4 samples under the
interleaved order, so each rank alternates forwards and backwards of different microbatches through two chunks
of sharded blocks. Checked against one process on the same global batch: the loss, every gradient and the
weights after one clipped AdamW step, max |diff| <= 1e-5 x max |ref| (fp32), with tied embeddings and without.
"""

import contextlib

import pytest

from mimo.config.schema import Config, DataConfig, ModelConfig, ModuleLayoutConfig, OptimConfig, ParallelConfig
from mimo.parallel.data import FSDP_REDUCES_UNUSED_PARAMS
from tests.distributed.test_pipeline_fsdp import MICRO, PER_MB, RTOL, _batch, _reference
from tests.support.configs import PARITY_OPTIM, tiny_llm
from tests.support.dist import rank_device, run_distributed
from tests.support.parity import reference_and_parallel_copy, step_matches_reference


def _config(tied: bool) -> Config:
    lm = ModuleLayoutConfig(pp=2, fsdp=True, virtual_stages=2)
    return Config(model=ModelConfig(llm=tiny_llm(layers=4, init_std=0.1, tie_embeddings=tied)),
                  parallel=ParallelConfig(modules={"language": lm}, microbatches=MICRO),
                  data=DataConfig(global_batch=PER_MB * MICRO), optim=OptimConfig(**PARITY_OPTIM))


def _case(rank: int, world: int, tied: bool) -> float:
    what = f"LM pp2 x v2 x dp2 fsdp tied {tied}"
    cfg, batch = _config(tied), _batch()
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda model: _reference(cfg, batch, model))
    assert plan.fsdp_modules() == ["language"], what
    assert all(hasattr(p, "full_tensor") for p in par.language_model.parameters()), f"{what}: every weight sharded"
    assert len(par.language_model.layers) == 2, f"{what}: two chunks of one layer on each rank"
    pipe = plan.pipeline
    assert pipe.chunks == 2, f"{what}: the interleaved schedule runs"
    result = pipe.train_step(par, batch if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
    worst = abs(result.loss - ref["loss"]) / abs(ref["loss"])
    assert worst <= RTOL, f"{what}: loss {result.loss} vs {ref['loss']}"
    return max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))


def _cases(rank: int, world: int) -> list[float]:
    return [_case(rank, world, tied) for tied in (True, False)]


@pytest.mark.skipif(not FSDP_REDUCES_UNUSED_PARAMS, reason="needs FSDP2's set_reduce_scatter_unused_params")
def test_sharded_interleaved_lm_equals_single_process():
    worst = run_distributed(_cases, 4, timeout=600)[0]
    assert max(worst) <= RTOL, worst
