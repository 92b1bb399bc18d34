"""MasterAdamW sharded over data-parallel ranks (ZeRO-1) takes the same steps as one process.

Each rank computes the gradient of the mean loss over its own slice of a global batch; the reference
is the unsharded optimizer on the mean loss over the whole batch (the mean of the ranks' gradients,
the slices being equal). Layer sizes are multiples of nothing, so parameters straddle shard borders
and the flat buffers need padding to split evenly. Parameters left without a gradient on every rank in some
steps (as the trainer leaves an unfed modality) are skipped as torch's AdamW on one process skips them, with the
gradients reduce-scattered by the optimizer or summed by the caller (`summed_grads`).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mimo.perf.master_adamw import MasterAdamW
from tests.support.dist import run_distributed

BATCH = 8
STEPS = 3
# Adam's step is invariant to the gradient's scale apart from eps: an eps near the gradients' size makes
# a wrong scale (a sum over ranks instead of their mean) change the weights far beyond the tolerance.
OPT = {"lr": 1e-2, "betas": (0.8, 0.9), "eps": 1e-2, "weight_decay": 0.1, "dtype": torch.float32}


def make_model() -> nn.Module:
    """64-element blocks: 1 + 1 + 3 (straddles a shard border on 2 and 4 ranks) + 1 + 1 = 7, padded to 8."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 19), nn.Tanh(), nn.Linear(19, 2, bias=False))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 5, generator=g), torch.randn(BATCH, 2, generator=g)


def train(model: nn.Module, opt: MasterAdamW | torch.optim.AdamW, rows: slice, unfed: dict | None = None
          ) -> torch.Tensor:
    """STEPS steps on the mean loss over `rows` of each batch, the parameters `unfed[step]` names (indices into
    model.parameters()) left without a gradient; the final weights, flattened."""
    for step in range(STEPS):
        x, y = batch(step)
        (model(x[rows]) - y[rows]).square().mean().backward()
        params = list(model.parameters())
        for i in (unfed or {}).get(step, ()):
            params[i].grad = None
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def sharded_rank(rank: int, world_size: int) -> dict:
    """This rank's weights after sharded training, and the reference's, trained here on the same device."""
    model = make_model()
    opt = MasterAdamW(model.parameters(), group=dist.group.WORLD, chunk=100, **OPT)
    share = BATCH // world_size
    weights = train(model, opt, slice(rank * share, (rank + 1) * share))
    ref_model = make_model()
    ref_opt = MasterAdamW(ref_model.parameters(), **OPT)
    ref = train(ref_model, ref_opt, slice(None))
    return {"weights": weights.cpu(), "ref": ref.cpu(), "master": opt.master.numel(), "total": opt.weight.numel(),
            "unpadded": ref_opt.weight.numel()}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_steps_match_one_process(world_size):
    results = run_distributed(sharded_rank, world_size)
    for rank, r in enumerate(results):
        assert r["total"] % (world_size * 64) == 0 and r["unpadded"] < r["total"] < r["unpadded"] + world_size * 64
        assert r["master"] * world_size == r["total"], rank
        diff, ref = (r["weights"] - r["ref"]).abs().max(), r["ref"].abs().max()
        assert diff <= 1e-6 * ref, (rank, float(diff), float(ref))
        assert torch.equal(r["weights"], results[0]["weights"]), rank


UNFED = {1: (2, 3), 2: (0,)}  # step -> parameters without a gradient: the middle linear, then the first weight


def skipping_rank(rank: int, world_size: int, summed: bool) -> dict:
    """This rank's weights after sharded training that leaves some parameters without a gradient, and torch's
    AdamW's on one process with the same gaps."""
    model = make_model()
    opt = MasterAdamW(model.parameters(), group=dist.group.WORLD, chunk=100, summed_grads=summed, **OPT)
    share = BATCH // world_size
    weights = train(model, opt, slice(None) if summed else slice(rank * share, (rank + 1) * share), UNFED)
    ref_model = make_model()
    kwargs = {k: v for k, v in OPT.items() if k != "dtype"}
    ref = train(ref_model, torch.optim.AdamW(ref_model.parameters(), **kwargs), slice(None), UNFED)
    return {"weights": weights.detach().numpy(), "ref": ref.detach().numpy(), "steps": opt.steps.tolist()}


@pytest.mark.parametrize("summed", [False, True], ids=["reduce_scattered", "summed_grads"])
def test_sharded_steps_skip_parameters_without_gradients_like_torch_adamw(summed):
    results = run_distributed(skipping_rank, 2, summed)
    for rank, r in enumerate(results):
        diff, ref = abs(r["weights"] - r["ref"]).max(), abs(r["ref"]).max()
        assert diff <= 1e-6 * ref, (rank, float(diff), float(ref))
        assert r["steps"] == [STEPS - 1, STEPS, STEPS - 1, STEPS - 1, STEPS], (rank, r["steps"])
