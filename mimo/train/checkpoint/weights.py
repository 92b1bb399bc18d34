"""The training state (weights and optimizer per module) in and out of DCP checkpoints, and a run's model
read back from one on a single process. No pickled code is ever loaded."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter

from mimo.config.load import load_config
from mimo.config.schema import Config
from mimo.hf.build import build_model
from mimo.models.multimodal import MimoModel, modules_by_name
from mimo.train.checkpoint.safe_dcp import SafeFileSystemReader, read_metadata_file
from mimo.train.checkpoint.store import CheckpointStore
from mimo.train.checkpoint.tensors import CheckpointTensors, resolve_checkpoint


def save_weights(model: MimoModel, run_dir: Path, step: int = 0) -> Path:
    """A single-process model's weights (no optimizer state) as the complete checkpoint
    `run_dir/checkpoints/step_<step>`, the form `load_run` and `mimo export` read."""
    store = CheckpointStore(Path(run_dir) / "checkpoints", keep=1 << 30)
    tmp = store.prepare(step)
    save_training_state(tmp, {"model": {n: m.state_dict() for n, m in modules_by_name(model).items()}, "optim": {}})
    return store.publish(step, {"reason": "weights"}, {})


def load_run(run: str | Path) -> tuple[Config, MimoModel]:
    """The single-process model of a run (its newest complete checkpoint) or of one of its
    `checkpoints/step_*` folders, read tensor by tensor from the sharded checkpoint whatever layout wrote it."""
    run_dir, step_dir = resolve_checkpoint(run)
    cfg = load_config(run_dir / "config.toml", saved_run=True)
    # Built on the meta device, so no time goes into a random initialisation the weights replace; every
    # tensor of the model is in the checkpoint (strict), so nothing stays on meta.
    with torch.device("meta"):
        model = build_model(cfg.model, load_weights=False)
    tensors = CheckpointTensors(step_dir)
    model.load_state_dict({name: tensors.read(name) for name in model.state_dict()}, strict=True, assign=True)
    model.eval()
    return cfg, model


# Training state through DCP ----------------------------------------------------------------------
# One tree per module: {"model": {module: state_dict}, "optim": {module: {param_fqn: {key: tensor}}}}.
# Every tensor is saved as the module holds it: a plain tensor where it is replicated (DP), a DTensor
# where it is sharded (FSDP2, DTensor TP). DCP writes each replicated tensor once and each shard once,
# with global shapes and offsets, and loads by FQN into whatever layout the loading run has, so a
# checkpoint moves between layouts without ever gathering a full module on one rank.


def optimizer_state(module: nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """An optimizer's per-parameter state keyed by parameter FQN inside `module` (layout independent,
    unlike the optimizer's own integer keys). Parameters with no state yet are left out."""
    names = {id(p): n for n, p in module.named_parameters()}
    out = {}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st:
                out[names[id(p)]] = {k: v for k, v in st.items() if isinstance(v, torch.Tensor)}
    return out


def training_state(modules: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer],
                   master: dict | None = None) -> dict:
    """The tree DCP saves: each module's weights and, where it has one, its optimizer's state; with `master`
    (MasterOptimizer.master_state: tensors under keys unique to this rank) that too, under "master"."""
    tree = {"model": {n: m.state_dict() for n, m in modules.items()},
            "optim": {n: optimizer_state(modules[n], opt) for n, opt in optimizers.items()}}
    if master:
        tree["master"] = master
    return tree


def _fresh_like(tree: dict) -> dict:
    """A tree of the same keys with a fresh uninitialised tensor like each of `tree`'s."""
    return {k: _fresh_like(v) if isinstance(v, dict) else torch.empty_like(v) for k, v in tree.items()}


def _copy_into(dst: dict, src: dict) -> None:
    """Copy each tensor of `src` into the tensor of `dst` under the same keys."""
    for k, v in dst.items():
        if isinstance(v, dict):
            _copy_into(v, src[k])
        else:
            v.copy_(src[k])


def flatten(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """Nested dict -> {dotted key: tensor}, the keys DCP records in its index."""
    out: dict[str, torch.Tensor] = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def save_training_state(directory: Path, state: dict) -> None:
    """Write `state` with DCP into `directory` (collective over the default group when one exists)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.save(state, storage_writer=FileSystemWriter(str(directory)), no_dist=not dist.is_initialized())


def _template(modules: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer],
              saved: set[str]) -> dict:
    """Fresh tensors shaped and placed like this run's weights and optimizer state, to load into."""
    model = {n: {k: torch.empty_like(v) for k, v in m.state_dict().items()} for n, m in modules.items()}
    optim: dict[str, dict] = {}
    for name, opt in optimizers.items():
        fused = bool(opt.defaults.get("fused")) or bool(opt.defaults.get("capturable"))
        per_param = {}
        for fqn, p in modules[name].named_parameters():
            if not p.requires_grad or f"optim.{name}.{fqn}.step" not in saved:
                continue
            keys = [k for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if f"optim.{name}.{fqn}.{k}" in saved]
            entry = {k: torch.empty_like(p, memory_format=torch.preserve_format) for k in keys}
            entry["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
            per_param[fqn] = entry
        optim[name] = per_param
    return {"model": model, "optim": optim}


def _scalar_step_counts(master: dict, saved: dict) -> None:
    """Let `master` (a fresh template of MasterOptimizer.master_state) load a checkpoint that holds a part's update
    count as one scalar "step" (every parameter of the part updated that many times) instead of one per parameter:
    that part's "step" becomes a scalar placeholder, which `_copy_into` broadcasts to every parameter's count.
    `saved`: the checkpoint's DCP state_dict_metadata."""
    for rank, parts in master.items():
        for part, state in parts.items():
            entry = saved.get(f"master.{rank}.{part}.step")
            if entry is not None and tuple(entry.size) == ():
                state["step"] = state["step"].new_empty(())


def load_training_state(directory: Path, modules: dict[str, nn.Module],
                        optimizers: dict[str, torch.optim.Optimizer],
                        to_dcp: Callable[[dict], dict] = lambda tree: tree, master: dict | None = None) -> None:
    """Load a checkpoint written by `save_training_state` into this run's modules and optimizers, in
    whatever layout they now have (collective). `to_dcp` is the view that was applied when saving
    (see reshard.globalize); `master` (`training_state`'s) is loaded into its tensors in place. Everything
    is read into fresh tensors first and copied in only when the whole read succeeded, so a corrupt checkpoint
    never leaves a half-loaded model."""
    meta = read_metadata_file(Path(directory) / ".metadata")
    saved = meta.state_dict_metadata
    template = _template(modules, optimizers, set(saved))
    if master:
        template["master"] = _fresh_like(master)
        _scalar_step_counts(template["master"], saved)
    view = to_dcp(template)
    flat = flatten(view)
    missing = [k for k in flat if k not in saved]
    if missing:
        raise ValueError(f"checkpoint '{directory}' has no {missing[:3]} ({len(missing)} missing); it was written "
                         "for a different model config (model.*) or a different set of modules")
    wrong = [f"{k}: saved {tuple(saved[k].size)} vs now {tuple(t.shape)}" for k, t in flat.items()
             if tuple(saved[k].size) != tuple(t.shape)]
    if wrong:
        raise ValueError(f"checkpoint '{directory}' does not fit this model: {wrong[:3]}; load it with the model "
                         "config it was written with")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(view, storage_reader=SafeFileSystemReader(str(directory)), no_dist=not dist.is_initialized())
    with torch.no_grad():
        for name, mod in modules.items():
            for k, v in mod.state_dict().items():
                v.copy_(template["model"][name][k])
        if master:
            _copy_into(master, template["master"])
        for name, opt in optimizers.items():
            params = dict(modules[name].named_parameters())
            opt.state.clear()
            for fqn, entry in template["optim"][name].items():
                opt.state[params[fqn]] = entry
