"""The step loop that ties the rooms together: data -> microbatches -> forward/backward with the
per-token loss -> one gradient finalisation -> optimizer -> metrics -> checkpoint."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from mimo.config.load import dump_toml, to_dict
from mimo.config.schema import Config
from mimo.data.batching import to_device, with_precomputed_rows
from mimo.data.checks import check_batch
from mimo.data.lanes import LANE_KEYS, LaneBalancer
from mimo.data.packing import PackedBatches
from mimo.hf.build import build_model, load_hf_weights_into
from mimo.models.flops import train_step_flops
from mimo.models.loss import loss_weights
from mimo.models.multimodal import MimoModel, modules_by_name
from mimo.models.out_loss import OutPathLoss
from mimo.models.runtime import ModelRuntime
from mimo.models.sample_rows import fed_modalities
from mimo.models.step_hints import forward_args
from mimo.parallel.decoding import whole_sequences
from mimo.parallel.pipeline.step import StepResult
from mimo.parallel.plan import ParallelPlan
from mimo.parallel.runtime import init_distributed, leave_if_joined
from mimo.parallel.tensor import sequence_parallel_rows
from mimo.perf.apply import apply_fast_paths
from mimo.perf.gpu_defaults import fast_paths_note
from mimo.tasks import build_demo_data, evaluate_demo
from mimo.train.batch_shares import BatchShares
from mimo.train.checkpoint.resume import RunCheckpointer
from mimo.train.faults import StepGuard, skip_step
from mimo.train.gate import launch_world_size, validate_run
from mimo.train.held_out import evaluate_held_out, read_batch
from mimo.train.host_memory import set_mmap_threshold
from mimo.train.master_optim import MasterOptimizer
from mimo.train.metrics import MetricsLogger, to_json
from mimo.train.module_time import ModuleTime
from mimo.train.optim import MimoOptimizer, StepOptimizer
from mimo.train.plot import plot_curve, run_curve
from mimo.train.precision import step_autocast, with_module_precision
from mimo.train.router_loss import ROUTER_KEYS, RouterLosses
from mimo.train.run_folder import RunFolder
from mimo.train.threads import set_threads
from mimo.train.throughput import Throughput
from mimo.train.wandb_mirror import require_wandb


class Trainer:
    """The training loop. Its ParallelPlan lays each module out on its own grid and supplies the few collectives
    the loop needs; on one process the plan holds every module whole and each of those services is the identity
    (no process group).

    The process group it joins (under torchrun) it also leaves: at the end of `train()`, or on leaving a
    `with Trainer(cfg) as trainer:` block for a script that drives `train_step` itself. A group its caller
    joined first is left to the caller."""

    def __init__(self, cfg: Config, run_dir: Path | None = None):
        self.cfg, fast_paths = validate_run(cfg, launch_world_size())
        cfg = self.cfg  # the GPU defaults resolved: what the run trains with and writes to config.toml
        note = set_threads(cfg.train.threads)
        set_mmap_threshold(cfg.train.host_mmap_threshold_mb)
        if int(os.environ.get("RANK", "0")) == 0:
            for line in (note, fast_paths_note(fast_paths)):
                if line:
                    print(line, file=sys.stderr)
        if cfg.metrics.wandb:
            require_wandb()
        self.rank, self.world = init_distributed(torch.device(cfg.train.device).type, cfg.parallel.timeout_s)
        self.is_main = self.rank == 0
        self.device = torch.device(cfg.train.device)
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cuda":
            # float32 means float32: cuDNN would otherwise run the ViT's patch conv in TF32 (matmuls already don't)
            torch.backends.cudnn.allow_tf32 = all(cfg.precision.dtype_of(m) != "float32"
                                                  for m in cfg.model.module_names)
        self.plan = ParallelPlan(cfg, self.rank, self.world)
        torch.manual_seed(cfg.train.seed)
        self.module_time = ModuleTime(self.device, cfg.metrics.time_share_every, cfg.metrics.throughput_warmup)
        self.model = self.build_model()
        self.data = build_demo_data(cfg, self.model)
        if cfg.data.packing:
            self.data = PackedBatches(self.data, cfg.data.pack_length, self.plan.batch_multiple())
        self.shares = BatchShares(self.data, cfg.model)
        self.balancer = LaneBalancer(cfg.model, self.plan.data_lanes(),
                                     cfg.parallel.microbatches) if cfg.data.balance_lanes else None
        if hasattr(self.data, "shard_for"):  # balanced lanes reorder rows by the whole batch: every rank decodes it
            self.data.shard_for(self.plan.microbatches if self.balancer is None else lambda batch: [batch],
                                cfg.data.global_batch, self.plan.agree_on_data())
        self.optimizer = self.build_optimizer()
        if cfg.perf.encoder_offload:  # the gate allows it on a colocated pipelined layout only
            self.plan.pipeline.offload_states(self.optimizer.state_tensors)
        self.guard = StepGuard(cfg.train.max_bad_steps, self.device)
        self.out_loss = OutPathLoss(cfg.model)
        self.router_losses = RouterLosses(self.model, cfg, self.device)
        self.run_dir = run_dir or Path(cfg.run.out_dir) / cfg.run.name
        self.run_folder = RunFolder(cfg, self.run_dir, self.rank)
        self.checkpointer = RunCheckpointer(cfg, self.run_dir, modules_by_name(self.model), self.optimizer, self.guard,
                                            self.plan, self.data)

    # Building: the model laid out by the plan, its optimizer --------------------------------------
    def build_model(self) -> MimoModel:
        """The model built on the meta device, laid out by the plan with the fast paths in their place (after
        TP, CP and the pipeline split, before data parallelism), then materialised: each rank allocates and
        initialises only what it holds, with the single-process values (init by parameter name), and reads
        only its pieces of the hf_path weights."""
        with torch.device("meta"):
            model = build_model(self.cfg.model, load_weights=False)
        lm_tp = self.plan.lm_tensor_parallel()
        self.plan.parallelize(model, compute_paths=lambda m, runtime: self.compute_paths(m, runtime, lm_tp),
                              device=self.device)
        load_hf_weights_into(model, self.cfg.model, self.plan.local_view(model))
        return model

    def compute_paths(self, model: MimoModel, runtime: ModelRuntime,
                      lm_tp: tuple[ProcessGroup, bool] | None = None) -> ModelRuntime:
        """The fast paths installed on `model` and the runtime it computes with: `runtime` (the layout's) with
        the chunked loss and each modality's own precision where the config asks for them, and the module clock."""
        runtime = with_module_precision(self.cfg, model, apply_fast_paths(self.cfg, model, runtime, lm_tp))
        return dataclasses.replace(runtime, module_clock=self.module_time)

    def build_optimizer(self) -> StepOptimizer:
        """MimoOptimizer (fp32 weights), or MasterOptimizer under precision.master_weights (turns them bf16)."""
        f = self.cfg.perf
        if self.cfg.precision.master_weights:
            modules = modules_by_name(self.model)
            sharded = {n: self.plan.master_state_groups(n) for n in modules}
            return MasterOptimizer(modules, self.cfg.optim, self.cfg.train.steps, grad_table=f.grad_table,
                                   compile=f.compile and self.device.type == "cuda", groups=sharded,
                                   norm_sq_reduce=self.plan.norm_sq_reduce, fsdp=self.plan.fsdp_modules())
        return MimoOptimizer(modules_by_name(self.model), self.cfg.optim, self.cfg.train.steps,
                             fused=self.device.type == "cuda", norm_sq_reduce=self.plan.norm_sq_reduce)

    # The step ----------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        """One step on every layout: this rank's share of the global batch forward and backward (its microbatches,
        `colocated_pass`, or the 1F1B schedule, `pipeline_pass`), the gradients finalised once across modules and
        none left for what the batch does not feed, then the optimizer's update, or a skip every rank agrees on;
        the step's record. Collective."""
        self.optimizer.begin(step)  # MasterOptimizer's learning rates, on the device
        self.router_losses.begin()
        self.module_time.sample()
        result, fed, lanes = (self.pipeline_pass if self.plan.pipeline is not None else self.colocated_pass)(step)
        self.plan.finalize_grads(self.model)
        self.leave_unfed(fed)
        router_objective, router_log = self.router_losses.end(self.plan.sum_lm_rows)
        rec = self.update(step, result.loss + result.out_objective + router_objective)
        self.router_losses.after_update(rec["stepped"])
        return {**rec, "tokens": result.tokens, "loss_tokens": result.loss_tokens, "flops": result.flops, **lanes,
                **result.out_losses, **router_log}

    def colocated_pass(self, step: int) -> tuple[StepResult, frozenset[str], dict]:
        """Forward and backward of this rank's microbatches of `step` (one process, or modules on the same ranks):
        the step's numbers (the Out path's objective and losses summed over the LM's data lanes), the modalities
        its batch feeds, the lane imbalance figures. Collective where the layout is."""
        host, tokens, flops, lanes, fed = self.host_batch(step)
        loss_total, n_global = self.forward_backward([to_device(mb, self.device) for mb in host])
        out_objective, out_losses = self.out_loss.end(self.plan.all_reduce_lm_lanes)
        loss = float(loss_total / n_global.clamp_min(1.0))
        return StepResult(loss, int(n_global), tokens, flops, out_objective, out_losses), fed, lanes

    def host_batch(self, step: int) -> tuple[list[dict], int, int, dict, frozenset[str]]:
        """This rank's microbatches of `step` on the host (checked, rows balanced between lanes under
        data.balance_lanes, with their precomputed positions under perf.loss_rows_only), the global batch's
        tokens, model FLOPs, lane imbalance figures and the modalities it feeds (`fed_modalities`)."""
        batch = self.data.global_batch(step, self.cfg.data.global_batch, self.cfg.data.seed)
        check_batch(self.model, batch)
        self.shares.count(batch)
        batch, lanes = self.balance(batch)
        micro = self.plan.microbatches(batch)
        t = self.cfg.perf
        if t.loss_rows_only:
            micro = [with_precomputed_rows(mb, self.model.special_token_ids) for mb in micro]
        lm_tp = self.plan.lm_tensor_parallel() if t.loss_rows_only else None
        if lm_tp is not None and lm_tp[1]:  # sequence parallel: each TP rank's rows of its own shard
            group = lm_tp[0]
            micro = [sequence_parallel_rows(mb, dist.get_world_size(group), dist.get_rank(group)) for mb in micro]
        fed = self.fed_by(batch)
        return micro, int(batch["input_ids"].numel()), train_step_flops(self.cfg.model, batch), lanes, fed

    def balance(self, batch: dict) -> tuple[dict, dict]:
        """The global batch with its rows balanced between data lanes and the imbalance figures
        (mimo.data.lanes) under data.balance_lanes; else the batch itself and no figures. Not collective."""
        return self.balancer(batch) if self.balancer is not None else (batch, {})

    def forward_backward(self, micro: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every microbatch's forward and backward: (loss sum, global loss tokens), summed over the LM's data
        lanes, on the device (no host sync unless the model's alignment needs one); the gradients are this rank's,
        not yet finalised."""
        local_tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in micro)
        n_global = self.plan.all_reduce_lm_data(local_tokens.detach().clone())
        scale = 1.0 / n_global.clamp_min(1.0)
        loss_total = torch.zeros((), device=self.device)
        self.out_loss.begin(micro, self.plan.all_reduce_lm_lanes, self.device)
        autocast = step_autocast(self.cfg, self.device)
        for mb in micro:
            with autocast:
                out = self.model(**forward_args(mb))
            (out.loss_sum * scale + self.out_loss.term(out)).backward()
            loss_total += out.loss_sum.detach()
        return self.plan.all_reduce_lm_data(loss_total), n_global

    def pipeline_pass(self, step: int) -> tuple[StepResult, frozenset[str] | None, dict]:
        """Forward and backward of every microbatch of `step` through this rank's stages, by the 1F1B schedule
        (mimo.parallel.pipeline.plan): the step's numbers, which every rank gets (rank 0 logs them even where it
        holds no LM stage); the modalities the batch feeds where this rank reads it (a first or last stage, or
        every rank of an FSDP2-sharded encoder with pp = 1), else None; the lane imbalance figures. Collective."""
        pipe = self.plan.pipeline
        d = self.cfg.data
        batch, problem = read_batch(lambda: self.data.global_batch(step, d.global_batch, d.seed), pipe.needs_data)
        if batch is not None:
            self.shares.count(batch)
        batch, lanes = self.balance(batch) if batch is not None else (batch, {})
        result = pipe.train_step(self.model, batch, self.device, lambda: step_autocast(self.cfg, self.device),
                                 problem=problem)
        return result, self.fed_by(batch) if batch is not None else None, lanes

    def fed_by(self, batch: dict) -> frozenset[str]:
        """The modalities the global `batch` feeds (`fed_modalities`). A reader that decodes only this rank's rows
        (`shard_for`) holds only their inputs, so there the ranks that read data agree: collective, one elementwise
        maximum of a flag per modality through the reader's own `agree`, which every reading rank calls here."""
        fed = fed_modalities(batch.get("modality_inputs"))
        if getattr(self.data, "input_rows", None) is None:
            return fed
        names = sorted(self.model.modality_submodules)
        flags = self.data.agree(torch.tensor([float(name in fed) for name in names]))
        return frozenset(name for name, flag in zip(names, flags.tolist()) if flag > 0)

    def leave_unfed(self, fed: frozenset[str] | None) -> None:
        """After the step's gradients are final: none for what its global batch, feeding only the modalities `fed`,
        does not train (`MimoModel.unfed_parameters`), so that every layout's optimizer skips those parameters as
        one process does; `fed` None (a pipeline stage that read no batch): the gradients as they are. Not
        collective (`fed_by` agreed `fed` where ranks read different rows)."""
        if fed is None:
            return
        for p in self.model.unfed_parameters(fed):
            p.grad = None

    def update(self, step: int, loss: float) -> dict:
        """The optimizer step after finalised gradients, or a skip that every rank agrees on when the loss
        or the gradients are not finite; the step's record."""
        if self.guard.agree(loss):
            stepped, grad_norm, lr = self.optimizer.step(step)
        else:
            stepped, grad_norm, lr = skip_step(self.optimizer, step)
        self.guard.record(stepped)
        return {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "stepped": stepped,
                "bad_steps": self.guard.consecutive_bad}

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Leave the process group this trainer joined (none joined, or the caller's: nothing to do). Its
        parallel steps cannot run after it; not collective."""
        leave_if_joined()

    def train(self) -> dict:
        """Collective: claim the run folder (refused when it holds another run or a live one), resume or start
        over, train, evaluate and write the outputs; the summary. Leaves the process group it joined when it
        ends, however it ends (`close`)."""
        with self, self.run_folder.claim():
            start = self.checkpointer.resume()
            if start == 0:
                self.run_folder.start_over()
            if self.is_main:
                where = f"resuming at step {start}" if start else "starting at step 0"
                print(f"mimo: run folder {self.run_dir} ({where})", file=sys.stderr, flush=True)
            self.checkpointer.set_aside_damaged()
            self.write_run_config(start)
            return self.train_from(start)

    def train_from(self, start: int) -> dict:
        cfg = self.cfg
        steps = cfg.train.steps
        m = cfg.metrics
        wandb = dict(project=m.wandb_project, name=cfg.run.name, config=to_dict(cfg)) if m.wandb else None
        logger = MetricsLogger(self.run_dir, steps, m.tensorboard, m.progress, enabled=self.is_main,
                               start_step=start, wandb=wandb)
        self.model.train()
        t0 = time.perf_counter()
        self.checkpointer.start_clock()
        throughput = Throughput(self.world, cfg.metrics.peak_tflops, self.device, t0, cfg.metrics.throughput_warmup)
        losses: list[tuple[int, float]] = []
        skipped = 0
        rec: dict = {}
        with self.guard.signal:
            for step in range(start, steps):
                rec = self.train_step(step)
                throughput.add(rec["flops"], rec["tokens"])
                skipped += not rec["stepped"]
                losses.append((step, rec["loss"]))
                if step % cfg.train.log_every == 0 or step == steps - 1 or not rec["stepped"]:
                    logger.log({**{k: rec[k] for k in ("step", "loss", "lr", "grad_norm", "tokens", "stepped",
                                                       "bad_steps", *self.out_loss.keys)},
                                **{k: rec[k] for k in (*ROUTER_KEYS, *LANE_KEYS) if k in rec},
                                **throughput.interval()})
                logger.progress(1, loss=rec["loss"], **throughput.running(), **self.shares.postfix())
                if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0:
                    began = time.perf_counter()
                    held_out = evaluate_held_out(cfg, self.model, self.data, self.plan, self.device)
                    logger.log_eval(step, held_out)
                    throughput.exclude(time.perf_counter() - began)
                    logger.note(f"mimo: step {step}: held-out loss {held_out['loss']:.4f} "
                                f"({time.perf_counter() - began:.1f} s)")
                if self.checkpointer.after_step(step):
                    logger.close()
                    return {"steps": step + 1, "stopped": "SIGTERM", "final_loss": rec["loss"],
                            "checkpoint": str(self.checkpointer.store.path(step + 1))}
        wall = time.perf_counter() - t0
        final = self.checkpointer.save_final(steps)
        summary = {"steps": steps, "final_loss": rec.get("loss"), "skipped_steps": skipped,
                   "wall_s": round(self.checkpointer.run_wall_s(), 2), **throughput.summary(wall),
                   "padding_share": self.shares.padding(), "flops_share": self.shares.flops(),
                   "time_share": self.module_time.shares(),
                   "world_size": self.world, "checkpoint": str(final)}
        if self.balancer is not None:
            summary["lane_imbalance"] = self.balancer.summary()
        if start:
            summary.update(resumed_at_step=start, segment_wall_s=round(wall, 2))
        return self.finish(summary, losses, start, logger)

    def finish(self, summary: dict, losses: list[tuple[int, float]], start: int, logger: MetricsLogger) -> dict:
        """Collective: the final evaluation on the sharded model (said on stderr as it starts and ends, see
        `evaluate`), then on rank 0 loss.png (the whole run, earlier segments and eval points included) and
        summary.json. The final weights are already the run's last checkpoint."""
        began = time.perf_counter()
        logger.note(f"mimo: evaluating the trained model on the held-out set (data.name = '{self.cfg.data.name}')")
        evaluation = self.evaluate()
        logger.note(f"mimo: evaluation done in {time.perf_counter() - began:.1f} s; writing {self.run_dir}")
        summary = {**summary, "eval": evaluation}
        if isinstance(self.data, PackedBatches):
            summary["padding"] = self.data.padding_report()
        if self.is_main:
            train_points, eval_points = run_curve(self.run_dir / "metrics.jsonl", start, losses)
            plot_curve(train_points, self.run_dir / "loss.png", eval_points, resumed_at=start)
            logger.write_summary(summary)
        logger.close()
        if self.is_main:
            print(to_json({"run": str(self.run_dir), **summary}, indent=2))
        self.plan.barrier()
        return summary

    def write_run_config(self, start: int) -> None:
        """Rank 0, once the start step is known (a checkpoint loaded, or none): the run folder's config.toml,
        and a metrics.jsonl of a run that starts over removed. Nothing in the folder is written before."""
        if not self.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.toml").write_text(dump_toml(self.cfg))
        if start == 0:
            (self.run_dir / "metrics.jsonl").unlink(missing_ok=True)

    def evaluate(self) -> dict:
        """The held-out evaluation of the trained model where it is: on one process the model itself; on a
        layout every rank evaluates its sharded model in step (collective: TP gathers logits, FSDP gathers
        each block's weights; LM sequence and context parallelism off, see mimo.parallel.decoding) where that
        layout can decode (no pipeline, equal data lanes); elsewhere it is left to `mimo eval --run`. Rank 0
        returns the result."""
        if not self.plan.decodes_in_place():
            return {"skipped": "this layout does not decode in place; run `mimo eval --run` on the run folder"}
        # Greedy decoding changes shapes every token: compiled blocks would recompile, so evaluate eagerly.
        with torch.compiler.set_stance("force_eager"), whole_sequences(self.plan, self.model):
            evaluation = evaluate_demo(self.cfg, self.model, self.data, self.device)
        return evaluation if self.is_main else {}
