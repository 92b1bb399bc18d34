"""What the parallel-vs-single-process tests share: the reference's gradients and optimizer step, and
the relative comparison every tensor goes through."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import torch

from mimo.config.schema import Config
from mimo.models.build import build_model
from mimo.models.loss import loss_weights
from mimo.models.multimodal import modules_by_name
from mimo.models.step_hints import forward_args
from mimo.parallel.plan import ParallelPlan
from mimo.train.optim import MimoOptimizer
from mimo.train.trainer import Trainer
from tests.support.tiny_run import tiny_config


def freeze_key_biases(model: torch.nn.Module) -> None:
    """A key bias shifts every score of a query equally, so softmax cancels it: its true gradient is 0
    and what backward returns is rounding noise, which Adam would blow up. Freeze it on both sides."""
    for name, p in model.named_parameters():
        if name.endswith("k_proj.bias"):
            p.requires_grad_(False)


def grads_then_step(cfg: Config, model: torch.nn.Module) -> tuple[dict, dict]:
    """After the reference's backward: every gradient (zeros where none), then one optimizer step that
    must clip (so the test covers the global norm), and the weights after it."""
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).clone() for n, p in model.named_parameters()}
    stepped, norm, _ = MimoOptimizer(modules_by_name(model), cfg.optim, 10).step(0)
    assert stepped and norm > cfg.optim.clip, "the case must exercise clipping"
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def reference_step(cfg: Config, batch: dict, model: torch.nn.Module) -> dict:
    """One process on the whole (unpacked) `batch`: the mean loss's backward, then `grads_then_step`; returns
    {"loss", "grads", "params"} as `step_matches_reference` reads them."""
    out = model(batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                modality_inputs=batch["modality_inputs"])
    loss = out.loss_sum / out.num_tokens
    loss.backward()
    grads, params = grads_then_step(cfg, model)
    return {"loss": loss.item(), "grads": grads, "params": params}


def colocated_step(plan: ParallelPlan, par: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward of this rank's microbatches of the global `batch` on a colocated layout, each loss sum
    divided by the global loss-token count (collective): (the global mean loss, that count)."""
    micro_batches = plan.microbatches(batch)
    tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in micro_batches)
    n_global = plan.all_reduce_lm_data(tokens.clone())
    loss = torch.zeros(())
    for mb in micro_batches:
        out = par(**forward_args(mb))
        (out.loss_sum / n_global).backward()
        loss += out.loss_sum.detach()
    return plan.all_reduce_lm_data(loss) / n_global, n_global


def _diff_and_scale(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    if not ref.numel():
        return 0.0, 0.0
    return (got - ref).abs().max().item(), ref.abs().max().item()


def rel_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref| (the plain difference where ref is all zeros)."""
    diff, scale = _diff_and_scale(got, ref)
    return diff / scale if scale else diff


def close(what: str, got: torch.Tensor, ref: torch.Tensor, rtol: float) -> float:
    """Assert max |got - ref| <= rtol x max |ref| (exact equality where ref is all zeros); returns the ratio."""
    diff, scale = _diff_and_scale(got, ref)
    assert diff <= rtol * scale, f"{what}: max |diff| {diff:.3g} > {rtol} x max |ref| {scale:.3g}"
    return diff / scale if scale else 0.0


def reference_and_parallel_copy(cfg: Config, rank: int, world: int, reference: Callable[[torch.nn.Module], dict],
                                compute_paths: Callable | None = None,
                                ) -> tuple[dict, ParallelPlan, torch.nn.Module, MimoOptimizer]:
    """The model cfg builds under seed 0 (key biases frozen): `reference(model)` run on it in this process, and a
    copy taken before, parallelized under cfg's layout as `rank` of `world` (collective; `compute_paths` as
    `ParallelPlan.parallelize` takes it), with its optimizer."""
    torch.manual_seed(0)
    model = build_model(cfg.model)
    freeze_key_biases(model)
    par = copy.deepcopy(model)
    ref = reference(model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(par, compute_paths)
    return ref, plan, par, MimoOptimizer(modules_by_name(par), cfg.optim, 10, norm_sq_reduce=plan.norm_sq_reduce)


def step_matches_reference(what: str, rank: int, plan, par: torch.nn.Module, opt: MimoOptimizer, ref: dict,
                           rtol: float) -> float:
    """After the parallel run's backward: finalize its gradients, gather them, take one optimizer step and
    gather the weights (collective); on rank 0 assert every gradient and weight within `rtol` of the
    one-process reference's (`grads_then_step`'s, as ref["grads"] and ref["params"]). The worst ratio (0.0
    off rank 0)."""
    plan.finalize_grads(par)
    grads = plan.gather_full(par, grads=True)
    stepped, _, _ = opt.step(0)
    assert stepped, what
    params = plan.gather_full(par)
    if rank != 0:
        return 0.0
    assert grads.keys() == ref["grads"].keys() == params.keys(), what
    worst = 0.0
    for kind, got, want in (("grad", grads, ref["grads"]), ("weight after step", params, ref["params"])):
        for name, t in got.items():
            worst = max(worst, close(f"{what} {kind} {name}", t, want[name], rtol))
    return worst


def trainer_steps(trainer: Trainer, steps: int) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """`trainer` run for `steps` steps (collective under a layout): each step's loss, and each step's
    gradients as the optimizer gets them, unsharded (on rank 0 under a layout; {} elsewhere)."""
    grads: list[dict[str, torch.Tensor]] = []
    update = trainer.update

    def capture(step: int, loss: float) -> dict:
        grads.append(trainer.plan.gather_full(trainer.model, grads=True))
        return update(step, loss)

    trainer.update = capture
    return [trainer.train_step(step)["loss"] for step in range(steps)], grads



def tiny_trainer_steps(out: Path, steps: int, *overrides: str) -> tuple[list[float], list[dict]]:
    """`tiny_config(out, *overrides)`'s Trainer run for `steps` steps (`trainer_steps`, collective under a layout):
    the losses, and the gradients as numpy arrays, which pickle out of a rank."""
    losses, grads = trainer_steps(Trainer(tiny_config(out, *overrides)), steps)
    return losses, [{n: g.numpy() for n, g in step.items()} for step in grads]

def assert_trains_like(what: str, run: tuple[list[float], list[dict]], reference: tuple[list[float], list[dict]],
                       rtol: float) -> None:
    """Each step's loss and every gradient (numpy arrays, as `trainer_steps` results travel from a rank) of `run`
    within `rtol` relative of `reference`. A key bias of a ViT or a decoder (no rotary positions) has a true gradient
    of zero (softmax cancels it), so both runs hold rounding noise there: it only has to be small against the
    weight's."""
    (losses, grads), (ref_losses, ref_grads) = run, reference
    for step, (a, b) in enumerate(zip(losses, ref_losses, strict=True)):
        assert abs(a - b) <= rtol * abs(b), f"{what} step {step}: loss {a} vs single-process {b}"
    for step, (got, ref) in enumerate(zip(grads, ref_grads, strict=True)):
        assert got.keys() == ref.keys(), f"{what} step {step}: gradient names differ"
        for name, g in got.items():
            g, r = torch.as_tensor(g), torch.as_tensor(ref[name])
            scale = noise_scale(name, ref)
            if scale is not None:
                assert max(g.abs().max(), r.abs().max()) <= rtol * scale, f"{what} step {step}: {name}"
                continue
            assert rel_diff(g, r) <= rtol, f"{what} step {step}: gradient {name} off by {rel_diff(g, r):.2e} relative"


def noise_scale(name: str, tensors: dict) -> torch.Tensor | None:
    """For a key bias of a ViT or a decoder (no rotary positions: softmax cancels it, so its true gradient is zero
    and runs hold rounding noise there), the scale that noise is held to: max |its weight| in `tensors` (name ->
    tensor or array). None for every other parameter."""
    if name.endswith("k_proj.bias") and not name.startswith("language_model."):
        return torch.as_tensor(tensors[name[: -len("bias")] + "weight"]).abs().max()
    return None


def assert_weights_like(what: str, weights: dict, reference: dict, rtol: float) -> None:
    """Every weight of `weights` (name -> tensor or array) within `rtol` x max |reference's|, a key bias within
    `rtol` of its weight's scale (`noise_scale`: both runs stepped on rounding noise there)."""
    assert weights.keys() == reference.keys(), f"{what}: weight names differ"
    for name, w in weights.items():
        w, r = torch.as_tensor(w), torch.as_tensor(reference[name])
        scale = noise_scale(name, reference)
        scale = r.abs().max() if scale is None else scale
        diff = (w - r).abs().max()
        assert diff <= rtol * scale, f"{what} weight {name}: max |diff| {diff:.3g} vs {rtol} x {scale:.3g}"
