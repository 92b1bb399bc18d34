"""The mixture-of-experts feed-forward against a hand-written loop over tokens, its router losses against
their formulas computed by hand, and its split invariance (the contract in mimo/models/moe.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mimo.models.moe import MoEFeedForward, grouped_experts, local_dispatch
from tests.support.configs import tiny_llm

H = 32


def make_moe(seed: int = 0, **changes) -> MoEFeedForward:
    torch.manual_seed(seed)
    cfg = tiny_llm(**{"moe_experts": 4, "moe_top_k": 2, "moe_mlp": 16, "init_std": 0.2, **changes})
    moe = MoEFeedForward(cfg)
    torch.nn.init.normal_(moe.router.weight, std=0.3)
    for lin in ([] if moe.shared is None else [moe.shared.gate_proj, moe.shared.up_proj, moe.shared.down_proj]):
        torch.nn.init.normal_(lin.weight, std=0.2)
    if moe.shared_gate is not None:
        torch.nn.init.normal_(moe.shared_gate.weight, std=0.3)
    return moe


def oracle(moe: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """One token at a time: its router scores, its k experts chosen by a Python sort, their weighted sum."""
    rows = []
    for token in x:
        logits = moe.router.weight @ token
        if moe.gating == "sigmoid":
            scores = torch.sigmoid(logits)
            choice = sorted(range(moe.num_experts), key=lambda e: -float(scores[e].detach() + moe.expert_bias[e]))
        else:
            scores = torch.softmax(logits, dim=0)
            choice = sorted(range(moe.num_experts), key=lambda e: -float(scores[e].detach()))
        chosen = choice[:moe.top_k]
        w = torch.stack([scores[e] for e in chosen])
        if moe.norm_topk:
            w = w / w.sum()
        y = torch.zeros(H)
        for wj, e in zip(w, chosen):
            inner = F.silu(moe.w_gate[e] @ token) * (moe.w_up[e] @ token)
            y = y + wj * (moe.w_down[e] @ inner)
        if moe.shared is not None:
            s = moe.shared(token)
            y = y + (s if moe.shared_gate is None else torch.sigmoid(moe.shared_gate(token)) * s)
        rows.append(y)
    return torch.stack(rows)


CASES = {
    "softmax": {},
    "softmax_norm_topk": {"moe_norm_topk": True},
    "top1": {"moe_top_k": 1},
    "shared_gated": {"moe_shared_mlp": 24, "moe_shared_gate": True},
    "shared_ungated": {"moe_shared_mlp": 24},
    "sigmoid_bias": {"moe_gating": "sigmoid", "moe_norm_topk": True},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_gradients_match_a_loop_over_tokens(case):
    moe = make_moe(**CASES[case]).eval()
    if moe.expert_bias is not None:
        moe.expert_bias.copy_(torch.tensor([0.0, 0.3, -0.2, 0.1]))
    x = torch.randn(2, 7, H, requires_grad=True)
    probe = torch.randn(2, 7, H)
    got = moe(x)
    (got * probe).sum().backward()
    grads = {n: p.grad.clone() for n, p in moe.named_parameters()}, x.grad.clone()
    moe.zero_grad()
    x.grad = None
    want = oracle(moe, x.reshape(-1, H)).view(2, 7, H)
    (want * probe).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, p in moe.named_parameters():
        torch.testing.assert_close(grads[0][name], p.grad, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(grads[1], x.grad, rtol=1e-5, atol=1e-6)


def test_an_imbalanced_router_sends_every_token_to_the_same_experts():
    """Router rows 1, 0.5, 0, 0 and positive tokens: every token picks experts 0 and 1, experts 2 and 3 get none
    (no gradient either), and no token is dropped."""
    moe = make_moe().eval()
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([1.0, 0.5, 0.0, 0.0])[:, None].expand(4, H))
    x = torch.rand(3, 5, H) + 0.1
    weights, ids, _ = moe.route(x.reshape(-1, H))
    assert (ids == torch.tensor([0, 1])).all()
    got = moe(x)
    got.sum().backward()
    torch.testing.assert_close(got, oracle(moe, x.reshape(-1, H)).view_as(x), rtol=1e-5, atol=1e-6)
    assert moe.w_up.grad[2:].abs().max() == 0 and moe.w_up.grad[:2].abs().min() > 0


def test_sigmoid_bias_steers_the_choice_but_not_the_weights():
    moe = make_moe(moe_gating="sigmoid").eval()
    moe.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 100.0]))
    x = torch.randn(9, H)
    weights, ids, logits = moe.route(x)
    assert (ids[:, 0] == 3).all()
    torch.testing.assert_close(weights[:, 0], torch.sigmoid(logits[:, 3]))


def by_hand(ids: torch.Tensor, logits: torch.Tensor, e: int, k: int) -> tuple[float, float]:
    """(sum over rows of the balance loss, sum over rows of the z-loss), written out with Python loops."""
    balance = z = 0.0
    for row_ids, row_logits in zip(ids.tolist(), logits.tolist()):
        tokens = len(row_logits)
        probs = [[math.exp(v) / sum(math.exp(u) for u in t) for v in t] for t in row_logits]
        for expert in range(e):
            count = sum(1 for token in row_ids for chosen in token if chosen == expert)
            balance += e / (k * tokens**2) * count * sum(p[expert] for p in probs)
        z += sum(math.log(sum(math.exp(v) for v in t)) ** 2 for t in row_logits) / tokens
    return balance, z


def test_router_losses_match_their_formulas_and_reach_the_gradients():
    moe = make_moe(moe_aux_loss_weight=0.5, moe_z_loss_weight=0.25).train()
    moe.set_loss_scale(0.125)
    x = torch.randn(3, 6, H)
    weights, ids, logits = moe.route(x.reshape(-1, H))
    balance, z = by_hand(ids.view(3, 6, 2), logits.view(3, 6, 4), 4, 2)
    out = moe(x)
    stats = moe.step_stats
    assert stats["balance"].item() == pytest.approx(balance, rel=1e-5)
    assert stats["z_loss"].item() == pytest.approx(z, rel=1e-5)
    torch.testing.assert_close(stats["load"], torch.bincount(ids.reshape(-1), minlength=4).float())
    # The gradient the backward seeds: 0.125 * (0.5 balance + 0.25 z), with the counts held fixed.
    (out * 0).sum().backward()
    got = moe.router.weight.grad.clone()
    moe.zero_grad()
    logits = (x @ moe.router.weight.t())
    probs = torch.softmax(logits, -1)
    counts = F.one_hot(ids.view(3, 12), 4).sum(1).float()
    explicit = (4 / (2 * 36) * (counts * probs.sum(1)).sum(1)).sum() * 0.5
    explicit = explicit + (torch.logsumexp(logits, -1).square().sum(1) / 6).sum() * 0.25
    (0.125 * explicit).backward()
    torch.testing.assert_close(got, moe.router.weight.grad, rtol=1e-5, atol=1e-8)


def test_all_tokens_on_one_expert_costs_the_number_of_experts():
    """Top-1 with probability ~1 on one expert: balance = E per row; a uniform router costs 1."""
    moe = make_moe(moe_top_k=1).train()
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([50.0, 0.0, 0.0, 0.0])[:, None].expand(4, H))
    moe(torch.rand(2, 4, H) + 0.1)
    assert moe.step_stats["balance"].item() == pytest.approx(2 * 4, rel=1e-4)
    moe.step_stats = {}
    with torch.no_grad():
        moe.router.weight.zero_()
    moe(torch.rand(2, 4, H))  # equal logits: every probability 1/4, the ties all go to one expert
    assert moe.step_stats["balance"].item() == pytest.approx(2 * 4 * 0.25, rel=1e-5)


def test_router_loss_gradients_do_not_depend_on_how_the_rows_are_split():
    """Two forwards of two rows each, with the trainer's fixed scale, give one forward of four rows' gradients."""
    moe = make_moe(moe_aux_loss_weight=0.3, moe_z_loss_weight=0.1).train()
    moe.set_loss_scale(1 / 4)
    x = torch.randn(4, 5, H)
    moe(x).sum().backward()
    whole = {n: p.grad.clone() for n, p in moe.named_parameters()}
    moe.zero_grad()
    for part in x.split(2):
        moe(part).sum().backward()
    for n, p in moe.named_parameters():
        torch.testing.assert_close(p.grad, whole[n], rtol=1e-5, atol=1e-5, msg=n)


def test_no_statistics_outside_training():
    moe = make_moe(moe_aux_loss_weight=0.3)
    with torch.no_grad():
        moe(torch.randn(2, 3, H))
    moe.eval()
    moe(torch.randn(2, 3, H))
    assert moe.step_stats == {}


def test_expert_compute_takes_global_expert_ids_on_a_slice_of_the_experts():
    """A module holding experts 2..3 only (`keep_experts(1, 2, ...)`, as expert parallelism keeps them) computes
    what the whole module computes for the same global ids."""
    moe = make_moe()
    part = make_moe()
    part.keep_experts(1, 2, local_dispatch)
    assert (part.expert_offset, part.expert_shard, part.w_up.shape[0]) == (2, (1, 2), 2)
    rows, counts = torch.randn(5, H), torch.tensor([3, 2])
    torch.testing.assert_close(part.expert_compute(rows, counts, 2), moe.expert_compute(rows, counts, 2))


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
def test_the_grouped_matmul_path_computes_the_loop_over_experts():
    """The GPU path's products, run forward on the CPU in bf16 (this torch's CPU kernel has no backward): the loop's
    outputs to bf16 rounding, an expert with no rows included."""
    moe = make_moe()
    rows, counts = torch.randn(9, H), torch.tensor([3, 0, 4, 2])
    with torch.no_grad():
        want = moe.expert_compute(rows, counts, 0)
        bf16 = [t.bfloat16() for t in (rows, moe.w_gate, moe.w_up, moe.w_down)]
        got = grouped_experts(bf16[0], counts, *bf16[1:], moe.act)
    assert got.dtype == torch.bfloat16 and (got.float() - want).abs().max() <= 0.02 * want.abs().max()
