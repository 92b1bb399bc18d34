"""The mixture-of-experts feed-forward (Qwen3-MoE, Qwen2-MoE with a shared expert, Mixtral, DeepSeek-style
sigmoid routing): a top-k router, E routed SwiGLU experts with stacked weights, dropless.

Single-device code. The forward is `route` (which experts, with which weights), then `dispatcher`
(default `local_dispatch`: sort the token copies by expert, `expert_compute`, unsort, weighted sum over each
token's k experts). Expert parallelism keeps a slice of the stacked weights along dim 0 (the expert) and gives
its own dispatcher (`keep_experts`), keeping `route` and `expert_compute`. Everything set from outside goes
through a method here: `keep_experts`, `share_rows`, `set_loss_scale`, `clear_step_stats`, `move_bias`.

Router losses (contract). They are defined per *row* of the LM's input (one sequence, `[B, S, H]`'s b) so
that any split of the global batch by rows gives the same objective. For row s of T_s tokens, c_se the
number of its tokens routed to expert e (sum_e c_se = k T_s), P_se the sum over its tokens of the router's
probability of e (softmax gating: the softmax; sigmoid gating: the scores normalised to sum 1), and z_t the
log-sum-exp of token t's router logits:

    balance_s = E / (k T_s^2) * sum_e c_se P_se        (1 when perfectly balanced, E when all on one expert
                                                        with probability 1; Switch Transformer's loss per row)
    z_s       = (1 / T_s) * sum_t z_t^2                 (ST-MoE's z-loss, per row)

and the objective gains, over the MoE layers L and the rows of the global batch,

    sum_l sum_s (moe_aux_loss_weight balance_s + moe_z_loss_weight z_s) * loss_scale

where `loss_scale` is set by the trainer to 1 / (|L| data.global_batch), a constant of the config, so every
layout and microbatch split computes what one process does. The loss reaches the gradients through
`_AddRouterLoss`, an identity on the layer's output whose backward also seeds the layer's loss with
`loss_scale`: it needs no path through the model's outputs (pipeline stages, activation checkpointing and
compiled blocks keep their signatures). Where a row is split over ranks (sequence or context parallel), the
per-row sums `[B, 2E + 1]` pass `row_stats` (identity here; an all-reduce there whose backward is an
all-reduce, the exact adjoint: mimo.parallel.expert.rows, through `share_rows`) and every rank then divides its
rows' losses by `row_shards`, so the ranks together count each row once.

Every training forward (grad enabled, not an activation-checkpoint recompute) adds its expert loads and
router losses to `step_stats` for the trainer's log (mimo.train.router_loss), divided by `logged_shards`:
how many of a row's ranks the trainer's log reduction sums over.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mimo.config.schema import LLMConfig
from mimo.models import init
from mimo.models.layers import SwiGLU, activation

Dispatcher = Callable[["MoEFeedForward", torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")
"""The stacked expert weights of a MoEFeedForward, dim 0 the expert."""


def local_dispatch(moe: MoEFeedForward, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor,
                   ) -> torch.Tensor:
    """Every expert on this process: `x` `[T, H]`, `weights` and `expert_ids` `[T, k]` -> `[T, H]`, each token's
    expert outputs summed with its weights in its own top-k order (the same sum wherever the experts ran)."""
    t, k = expert_ids.shape
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=moe.num_experts)
    y_sorted = moe.expert_compute(x.index_select(0, order // k), counts, 0)
    y = torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)
    return (y.view(t, k, -1) * weights.unsqueeze(-1).to(y.dtype)).sum(1)


class _AddRouterLoss(torch.autograd.Function):
    """Identity on `out`; its backward also gives `loss` (a scalar) the gradient `scale`."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale, ctx.loss_dtype = scale, loss.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.full((), ctx.scale, dtype=ctx.loss_dtype, device=grad.device), None


def grouped_mm_available(x: torch.Tensor) -> bool:
    """`torch._grouped_mm` runs bf16 on CUDA GPUs of compute capability 9.0 and later (Hopper)."""
    return (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(x.device) >= (9, 0))


def grouped_experts(x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                    down: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`expert_compute`'s math as three `torch._grouped_mm` products over the experts' row groups (no host sync)."""
    offs = torch.cumsum(tokens_per_expert, 0).to(torch.int32)
    inner = act(torch._grouped_mm(x_sorted, gate.transpose(1, 2), offs=offs))
    inner = inner * torch._grouped_mm(x_sorted, up.transpose(1, 2), offs=offs)
    return torch._grouped_mm(inner, down.transpose(1, 2), offs=offs)


class MoEFeedForward(nn.Module):
    """Routed experts (`w_gate`, `w_up` `[E, moe_mlp, H]`, `w_down` `[E, H, moe_mlp]`: expert e is the SwiGLU
    `w_down[e] @ (act(w_gate[e] @ x) * (w_up[e] @ x))`), a `router` Linear(H, E), an optional shared expert
    (`shared`, gated by sigmoid(`shared_gate`(x)) when present) and, for sigmoid gating, the balancing bias
    `expert_bias` `[E]` (a buffer: in checkpoints, never trained)."""

    def __init__(self, cfg: LLMConfig, moe_layers: int = 1):
        super().__init__()
        e, h, m = cfg.moe_experts, cfg.hidden, cfg.moe_mlp
        self.num_experts, self.top_k = e, cfg.moe_top_k
        self.gating, self.norm_topk = cfg.moe_gating, cfg.moe_norm_topk
        self.aux_weight, self.z_weight = cfg.moe_aux_loss_weight, cfg.moe_z_loss_weight
        self.act = activation(cfg.mlp_act)
        self.router = nn.Linear(h, e, bias=False)
        self.w_gate = nn.Parameter(torch.empty(e, m, h))
        self.w_up = nn.Parameter(torch.empty(e, m, h))
        self.w_down = nn.Parameter(torch.empty(e, h, m))
        for w in (self.w_gate, self.w_up, self.w_down):
            init.normal_(w, std=cfg.init_std)
        self.shared = SwiGLU(h, cfg.moe_shared_mlp, cfg.mlp_act) if cfg.moe_shared_mlp else None
        self.shared_gate = nn.Linear(h, 1, bias=False) if cfg.moe_shared_gate else None
        self.register_buffer("expert_bias", torch.zeros(e) if cfg.moe_gating == "sigmoid" else None)
        init.zeros_(self.expert_bias)
        # Settings from outside, each through its method (see the module docstring); the defaults are one process's.
        self.dispatcher: Dispatcher = local_dispatch
        self.expert_offset = 0  # the global id of w_*[0]: expert parallelism keeps a slice of the experts
        self.expert_shard: tuple[int, int] | None = None  # (rank, ep) once `keep_experts` sliced them
        self.row_stats: Callable[[torch.Tensor], torch.Tensor] = lambda stats: stats
        self.row_shards = self.logged_shards = 1
        self.loss_scale: float | None = None  # None: 1 / (moe_layers * rows of this forward)
        self.moe_layers = moe_layers
        self.step_stats: dict[str, torch.Tensor] = {}

    def keep_experts(self, rank: int, ep: int, dispatcher: Dispatcher) -> None:
        """Keep experts [rank * E/ep, (rank + 1) * E/ep) of the stacked weights (E divisible by ep; each a new
        Parameter with the full one's attributes, on the meta device while unmaterialised) and route the token
        copies through `dispatcher` (expert parallelism's exchange between ranks). Not collective."""
        local = self.num_experts // ep
        for name in EXPERT_WEIGHTS:
            full = getattr(self, name)
            piece = full.detach()[rank * local:(rank + 1) * local]
            piece = torch.empty_like(piece) if piece.is_meta else piece.clone()
            param = nn.Parameter(piece, requires_grad=full.requires_grad)
            param.__dict__.update(vars(full))  # tags set from outside (e.g. replica counts) and the init rule
            setattr(self, name, param)
        self.expert_offset, self.expert_shard, self.dispatcher = rank * local, (rank, ep), dispatcher

    def share_rows(self, row_stats: Callable[[torch.Tensor], torch.Tensor], shards: int, logged_shards: int) -> None:
        """Rows split over `shards` ranks: their per-row sums pass `row_stats` (the sum over those ranks), and
        `logged_shards` of them are summed again by the trainer's log (see the module docstring)."""
        self.row_stats, self.row_shards, self.logged_shards = row_stats, shards, logged_shards

    def set_loss_scale(self, scale: float) -> None:
        """The router losses' weight per row in the objective (the trainer's 1 / (|L| data.global_batch))."""
        self.loss_scale = scale

    def clear_step_stats(self) -> None:
        """Before a step's forwards: start its `step_stats` afresh."""
        self.step_stats = {}

    @torch.no_grad()
    def move_bias(self, load: torch.Tensor, rate: float) -> None:
        """Sigmoid routing's balancing step after an update: each expert's bias moves by `rate` towards the mean of
        the step's global loads `load` `[E]` (up when under it, down when over it)."""
        self.expert_bias += rate * torch.sign(load.mean() - load).to(self.expert_bias)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`x` `[T, H]` -> (weights `[T, k]` fp32, expert_ids `[T, k]` int64, router_logits `[T, E]` fp32)."""
        logits = self.router(x).float()
        if self.gating == "sigmoid":
            scores = torch.sigmoid(logits)
            ids = torch.topk(scores + self.expert_bias.float(), self.top_k, dim=-1).indices
            weights = scores.gather(-1, ids)
        else:
            weights, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, ids, logits

    def expert_compute(self, x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor, first_expert: int,
                       ) -> torch.Tensor:
        """Token rows sorted by expert `[N, H]` -> `[N, H]`: the first `tokens_per_expert[0]` rows through expert
        `first_expert` (a global expert id; this module's `w_*[0]` is expert `expert_offset`), the next through
        `first_expert + 1`, ... Reads the counts on the host (one sync) except on the grouped-matmul path."""
        n, first = tokens_per_expert.numel(), first_expert - self.expert_offset
        gate, up, down = (w[first:first + n] for w in (self.w_gate, self.w_up, self.w_down))
        if grouped_mm_available(x_sorted):
            return grouped_experts(x_sorted, tokens_per_expert, gate, up, down, self.act)
        outs = []
        for e, rows in enumerate(torch.split(x_sorted, tokens_per_expert.tolist())):
            outs.append((self.act(rows @ gate[e].t()) * (rows @ up[e].t())) @ down[e].t())
        return torch.cat(outs) if outs else x_sorted.new_zeros(0, x_sorted.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, S, H]` (or `[T, H]`, one row) -> the same shape."""
        flat = x.reshape(-1, x.shape[-1])
        weights, ids, logits = self.route(flat)
        out = self.dispatcher(self, flat, weights, ids)
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * shared)
        out = out.view_as(x)
        if self.training and torch.is_grad_enabled():
            rows = x.shape[0] if x.dim() == 3 else 1
            loss = self.router_losses(ids.view(rows, -1), logits.view(rows, -1, self.num_experts))
            if self.aux_weight or self.z_weight:
                scale = self.loss_scale if self.loss_scale is not None else 1.0 / (self.moe_layers * rows)
                out = _AddRouterLoss.apply(out, loss, scale)
        return out

    def router_losses(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Per-row expert ids `[B, S*k]` and logits `[B, S, E]` -> this layer's weighted router loss summed over
        its rows (divided by `row_shards`); records the step's statistics (see the module docstring). Collective
        where `row_stats` is (every rank of the row's group runs each MoE layer's training forward)."""
        e = self.num_experts
        counts = F.one_hot(ids, e).sum(1).float()
        if self.gating == "sigmoid":
            scores = torch.sigmoid(logits)
            probs = scores / scores.sum(-1, keepdim=True)
        else:
            probs = torch.softmax(logits, dim=-1)
        z_sq = torch.logsumexp(logits, dim=-1).square().sum(1, keepdim=True)
        stats = self.row_stats(torch.cat([counts, probs.sum(1), z_sq], dim=1))
        counts, prob_sums, z_sq = stats[:, :e], stats[:, e:2 * e], stats[:, 2 * e]
        tokens = counts.sum(1) / self.top_k
        balance = (e / (self.top_k * tokens.square()) * (counts * prob_sums).sum(1)).sum()
        z_loss = (z_sq / tokens).sum()
        if torch._C._current_graph_task_id() == -1:  # a forward, not a recompute inside the backward
            self.record(counts.sum(0) / self.logged_shards, balance / self.logged_shards, z_loss / self.logged_shards)
        return (self.aux_weight * balance + self.z_weight * z_loss) / self.row_shards

    def record(self, load: torch.Tensor, balance: torch.Tensor, z_loss: torch.Tensor) -> None:
        """Add one forward's expert loads `[E]` (token copies routed to each) and summed row losses to step_stats."""
        new = {"load": load.detach(), "balance": balance.detach(), "z_loss": z_loss.detach()}
        for key, value in new.items():
            self.step_stats[key] = self.step_stats[key] + value if key in self.step_stats else value


def moe_layers(model: nn.Module) -> dict[str, MoEFeedForward]:
    """{module name: MoEFeedForward} of a model, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MoEFeedForward)}
