"""The step loop that ties the rooms together: data -> microbatches -> forward/backward with the
per-token loss -> one gradient finalisation -> optimizer -> metrics -> checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from mimo.config import Config, dump_toml
from mimo.data.demo import DemoVLMData, slice_batch
from mimo.mimo_model import MimoModel, build_model
from mimo.train.checkpoint import save_weights
from mimo.train.evaluate import evaluate_answers
from mimo.train.loss import loss_weights
from mimo.train.metrics import MetricsLogger
from mimo.train.optim import MimoOptimizer
from mimo.train.plot import plot_curve


def build_demo_data(cfg: Config, model: MimoModel) -> DemoVLMData:
    if cfg.data.name != "shapes":
        raise ValueError(f"data.name = '{cfg.data.name}' is not a known data set; use 'shapes'")
    if len(cfg.model.modalities) != 1:
        raise ValueError("the shapes demo needs exactly one vision modality under model.modalities")
    (name, mcfg), = cfg.model.modalities.items()
    vit = model.modality_submodules[name].encoders["vit"]
    return DemoVLMData(cfg.data.train_samples, cfg.data.eval_samples, cfg.data.seed, vit.tokens_per_image,
                       mcfg.token_id, modality=name)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: to_device(v, device) if isinstance(v, dict) else
            (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def module_map(model: MimoModel) -> dict[str, torch.nn.Module]:
    """The modules that get their own optimizer: the LM ("language") and each modality submodule."""
    return {"language": model.language_model, **dict(model.modality_submodules.items())}


class Trainer:
    """Single-process trainer; the parallel runtime subclasses the hooks marked below."""

    def __init__(self, cfg: Config, run_dir: Path | None = None, is_main: bool = True):
        self.cfg = cfg
        self.is_main = is_main
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.device = torch.device(cfg.train.device)
        torch.manual_seed(cfg.train.seed)
        self.model = self.build_model().to(self.device)
        self.data = build_demo_data(cfg, self.model)
        self.optimizer = self.build_optimizer()
        self.run_dir = run_dir or Path(cfg.run.out_dir) / cfg.run.name
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(dump_toml(cfg))
            (self.run_dir / "metrics.jsonl").unlink(missing_ok=True)

    # Hooks the parallel runtime overrides -------------------------------------------------------
    def build_model(self) -> MimoModel:
        return build_model(self.cfg.model)

    def build_optimizer(self) -> MimoOptimizer:
        return MimoOptimizer(module_map(self.model), self.cfg.optim, self.cfg.train.steps,
                             fused=self.device.type == "cuda")

    def local_microbatches(self, batch: dict) -> list[dict]:
        """This rank's share of the global batch, split into microbatches."""
        n = batch["input_ids"].shape[0]
        k = self.cfg.parallel.microbatches
        if n % k:
            raise ValueError(f"data.global_batch ({n}) must be divisible by parallel.microbatches ({k})")
        m = n // k
        return [slice_batch(batch, i * m, (i + 1) * m) for i in range(k)]

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks that hold different data (identity on one process)."""
        return t

    # The step ----------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        batch = self.data.global_batch(step, self.cfg.data.global_batch, self.cfg.data.seed)
        micro = [to_device(mb, self.device) for mb in self.local_microbatches(batch)]
        local_tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in micro)
        n_global = self.all_reduce_sum(local_tokens.detach().clone())
        scale = 1.0 / n_global.clamp_min(1.0)
        loss_total = torch.zeros((), device=self.device)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16,
                                  enabled=self.cfg.train.dtype == "bfloat16")
        for mb in micro:
            with autocast:
                out = self.model(**mb)
            (out.loss_sum * scale).backward()
            loss_total += out.loss_sum.detach()
        stepped, grad_norm, lr = self.optimizer.step(step)
        loss = float(self.all_reduce_sum(loss_total) * scale)
        return {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "stepped": stepped,
                "tokens": int(batch["input_ids"].numel()), "loss_tokens": int(n_global)}

    def train(self) -> dict:
        cfg = self.cfg
        steps = cfg.train.steps
        logger = MetricsLogger(self.run_dir, steps, cfg.run.tensorboard, cfg.run.progress, enabled=self.is_main)
        self.model.train()
        t0 = time.perf_counter()
        tokens = 0
        losses: list[tuple[int, float]] = []
        skipped = 0
        rec: dict = {}
        for step in range(steps):
            rec = self.train_step(step)
            tokens += rec["tokens"]
            skipped += not rec["stepped"]
            losses.append((step, rec["loss"]))
            if step % cfg.train.log_every == 0 or step == steps - 1:
                logger.log({k: rec[k] for k in ("step", "loss", "lr", "grad_norm", "tokens")})
            logger.progress(1, loss=rec["loss"], tok_s=tokens / (time.perf_counter() - t0))
        wall = time.perf_counter() - t0
        logger.close()
        evaluation = self.evaluate()
        summary = {"steps": steps, "final_loss": rec.get("loss"), "skipped_steps": skipped,
                   "eval": evaluation, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1)}
        if self.is_main:
            save_weights(self.model, self.run_dir / "checkpoint")
            plot_curve([s for s, _ in losses], [v for _, v in losses], self.run_dir / "loss.png")
            logger.write_summary(summary)
            print(json.dumps({"run": str(self.run_dir), **summary}, indent=2))
        return summary

    def evaluate(self) -> dict:
        return evaluate_answers(self.model, self.data, device=self.device)
