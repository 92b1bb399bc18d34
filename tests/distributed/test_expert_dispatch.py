"""The all-to-all MoE dispatcher equals one process computing every token's experts itself.

World 4, ep 4 (one expert group) and ep 2 (two groups of two, experts also replicated over the other group):
each rank holds its own tokens (one rank none at all) and its slice of the stacked expert weights. Routings:
random top-2, every copy to expert 0 (one rank receives everything, the others nothing), and every copy to
the last expert. Checked against a single-process loop over experts on all ranks' tokens: the outputs, the
gradients of the tokens and routing weights, and the expert weights' gradients summed over the ranks holding
the same experts, max |diff| <= 1e-5 x max |ref|.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from mimo.parallel.expert.dispatch import all_to_all_moe
from mimo.parallel.grid import Grid
from tests.support.dist import run_distributed

EXPERTS, HIDDEN, MLP, TOP_K = 4, 8, 6, 2
TOKENS = [5, 0, 7, 3]  # per rank; rank 1 sends nothing


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"gate": (EXPERTS, MLP, HIDDEN), "up": (EXPERTS, MLP, HIDDEN), "down": (EXPERTS, HIDDEN, MLP)}
    return {k: torch.randn(*shape, generator=g) for k, shape in shapes.items()}


def _expert(w: dict[str, torch.Tensor], e: int, x: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ w["gate"][e].T) * (x @ w["up"][e].T)) @ w["down"][e].T


def _inputs(routing: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """All ranks' tokens, routing weights, expert ids and output cotangents, concatenated in rank order."""
    g = torch.Generator().manual_seed(1)
    n = sum(TOKENS)
    x = torch.randn(n, HIDDEN, generator=g)
    weights = torch.rand(n, TOP_K, generator=g)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(n)])
    if routing == "one":
        ids = torch.zeros_like(ids)
    elif routing == "last":
        ids = torch.full_like(ids, EXPERTS - 1)
    return x, weights, ids, torch.randn(n, HIDDEN, generator=g)


def _reference(routing: str) -> dict[str, torch.Tensor]:
    x, weights, ids, cot = _inputs(routing)
    w = {k: v.clone().requires_grad_() for k, v in _weights().items()}
    x.requires_grad_()
    weights.requires_grad_()
    y = torch.zeros_like(x)
    for e in range(EXPERTS):
        for j in range(TOP_K):
            mask = ids[:, j] == e
            y = y.index_add(0, mask.nonzero()[:, 0], weights[mask, j, None] * _expert(w, e, x[mask]))
    (y * cot).sum().backward()
    return {"y": y.detach(), "x": x.grad, "weights": weights.grad, **{k: v.grad for k, v in w.items()}}


def _close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    if not ref.numel():
        return
    scale = max(ref.abs().max().item(), 1e-30)
    err = (got - ref).abs().max().item()
    assert err <= 1e-5 * scale, f"{what}: max |diff| {err:.3g} > 1e-5 x {scale:.3g}"


def _run(rank: int, world: int, ep: int, routing: str) -> None:
    group, edp = Grid(dp=world).build_expert(ep)
    ref = _reference(routing)
    x, weights, ids, cot = _inputs(routing)
    lo, hi = sum(TOKENS[:rank]), sum(TOKENS[:rank + 1])
    local, first = EXPERTS // ep, dist.get_rank(group) * (EXPERTS // ep)
    w = {k: v[first:first + local].clone().requires_grad_() for k, v in _weights().items()}
    xs, ws = x[lo:hi].clone().requires_grad_(), weights[lo:hi].clone().requires_grad_()

    def compute(rows: torch.Tensor, per_expert: torch.Tensor, first_expert: int) -> torch.Tensor:
        assert first_expert == first and per_expert.shape == (local,)
        chunks = rows.split(per_expert.tolist())
        return torch.cat([_expert(w, j, c) for j, c in enumerate(chunks)])

    y = all_to_all_moe(xs, ws, ids[lo:hi], EXPERTS, compute, group)
    (y * cot[lo:hi]).sum().backward()
    what = f"ep{ep} {routing} rank {rank}"
    _close(y.detach(), ref["y"][lo:hi], f"{what} output")
    _close(xs.grad, ref["x"][lo:hi], f"{what} token grads")
    _close(ws.grad, ref["weights"][lo:hi], f"{what} routing-weight grads")
    for k, p in w.items():
        grad = p.grad.clone()
        dist.all_reduce(grad, group=edp)
        _close(grad, ref[k][first:first + local], f"{what} w_{k} grads")


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("routing", ["random", "one", "last"])
def test_all_to_all_matches_one_process(ep: int, routing: str):
    run_distributed(_run, 4, ep, routing, timeout=120)
