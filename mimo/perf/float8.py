"""FP8 training of chosen modules: `precision.module_dtype.<module> = "float8"`.

That module's linear layers compute their three products (forward, input gradient, weight gradient) in FP8
with dynamic scaling, through torchao's float8 training (`torchao.float8.convert_to_float8_training`, the
optional extra `mimo[fp8]`); `precision.float8_recipe` picks its scaling: "tensorwise" (one scale per tensor,
cuBLAS's kernel) or "rowwise" (one per row, CUTLASS's). Everything else of the module (attention, norms,
embeddings, activations) computes in bf16 as under `precision.dtype = "bfloat16"`, and the weights, master
weights and optimizer are those of bf16 training: a converted linear keeps its `weight` and `bias`
parameters, so names, state dicts and checkpoints do not change.

Which linears stay in bf16 (`float8_linears` holds the rule):
- the LM's output head (`lm_head`; a tied head is the embedding, no linear), whose logits feed the loss;
- any linear whose in or out features are not a multiple of 16 (`torch._scaled_mm`'s rule), e.g. a ViT's
  patch embedding of 14 x 14 x 3 = 588 inputs;
- under `perf.fuse_qkv`, each attention's q, k and v (their product is one matmul over the concatenated
  weights, made by the attention itself);
- linears a pipeline stage released (weight None: they run on another rank).

Installed by `apply_fast_paths` after fused q/k/v and before activation checkpointing, compilation and data
parallelism (FSDP2 then shards the converted linears' weights as any other; it all-gathers them in bf16,
not FP8). Tensor parallelism is refused by the gate (`check_float8_layout`): mimo's column- and row-parallel
linears are its own modules, which torchao does not convert.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.config.train_config import FLOAT8
from mimo.models.layers import SelfAttention
from mimo.models.multimodal import MimoModel, modules_by_name
from mimo.parallel.layout import Layout

FLOAT8_MIN_CAPABILITY = (8, 9)
"""The first CUDA compute capability with FP8 matrix instructions (Ada; Hopper is 9.0)."""

LinearFilter = Callable[[nn.Module, str], bool]
Float8Swap = Callable[[nn.Module, LinearFilter], object]
"""How the linears are converted: (root module, filter(module, fqn)) -> anything, swapping in place every
nn.Linear below the root that the filter accepts (torchao's `convert_to_float8_training` signature)."""


def float8_modules(cfg: Config) -> list[str]:
    """The modules whose linears compute in FP8, in the model's order."""
    return [n for n in cfg.model.module_names if cfg.precision.module_dtype.get(n) == FLOAT8]


def fused_qkv_linears(root: nn.Module) -> set[int]:
    """ids of the q, k and v projections of every attention below `root` that computes them in one product."""
    return {id(lin) for m in root.modules() if isinstance(m, SelfAttention) and m.fused_qkv
            for lin in (m.q_proj, m.k_proj, m.v_proj)}


def float8_linears(model: MimoModel, cfg: Config) -> dict[str, nn.Linear]:
    """{fully qualified name in `model`: linear} of every nn.Linear that computes in FP8 under `cfg` (the rule is
    the module docstring's); empty when no module is "float8"."""
    chosen: dict[str, nn.Linear] = {}
    prefixes = {id(model.language_model): "language_model", **{
        id(sub): f"modality_submodules.{n}" for n, sub in model.modality_submodules.items()}}
    for name in float8_modules(cfg):
        root = modules_by_name(model)[name]
        stay = fused_qkv_linears(root) | ({id(root.lm_head)} if name == LANGUAGE else set())
        for fqn, m in root.named_modules():
            if (type(m) is nn.Linear and id(m) not in stay and m.weight is not None
                    and m.in_features % 16 == 0 and m.out_features % 16 == 0):
                chosen[f"{prefixes[id(root)]}.{fqn}"] = m
    return chosen


def torchao_swap(recipe: str) -> Float8Swap:
    """torchao's `convert_to_float8_training` with `recipe`'s config ("tensorwise" or "rowwise"), the inner
    dimension padded to 16 where a product's token count is not a multiple of it (the weight gradient's inner
    dimension is the tokens: perf.loss_rows_only's rows, an encoder's class token)."""
    def swap(root: nn.Module, keep: LinearFilter) -> object:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True)
        return convert_to_float8_training(root, module_filter_fn=keep, config=config)
    return swap


def convert_float8(cfg: Config, model: MimoModel, swap: Float8Swap | None = None) -> list[str]:
    """Swap every linear `float8_linears` names for its FP8 version, in place; returns their names. `swap`
    defaults to torchao's (`torchao_swap(cfg.precision.float8_recipe)`); a test passes a CPU reference."""
    chosen = float8_linears(model, cfg)
    if not chosen:
        return []
    ids = {id(m) for m in chosen.values()}
    (swap or torchao_swap(cfg.precision.float8_recipe))(model, lambda m, fqn: id(m) in ids)
    return list(chosen)


def check_float8_support(cfg: Config) -> None:
    """A "float8" module needs a GPU of compute capability >= 8.9 and torchao (pure, before any collective)."""
    modules = float8_modules(cfg)
    if not modules:
        return
    field = f"precision.module_dtype.{modules[0]} = \"float8\""
    if not cfg.train.device.startswith("cuda"):
        raise ConfigError(f"{field} computes its linears with the GPU's FP8 matrix instructions, which train.device = "
                          f"\"{cfg.train.device}\" has not; use train.device = \"cuda\" on an Ada or Hopper GPU, or "
                          "module_dtype \"bfloat16\"")
    index = cfg.train.device.partition(":")[2]
    major, minor = torch.cuda.get_device_capability(int(index) if index else None)
    if (major, minor) < FLOAT8_MIN_CAPABILITY:
        raise ConfigError(f"{field} needs FP8 matrix instructions (compute capability >= 8.9: Ada, Hopper), but "
                          f"{torch.cuda.get_device_name(int(index) if index else None)} has {major}.{minor}; use "
                          "module_dtype \"bfloat16\" on this GPU")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(f"{field} trains through torchao's float8 training, which is not installed; pip install "
                          "'mimo[fp8]' (or torchao), or use module_dtype \"bfloat16\"")


def check_float8_layout(cfg: Config, layout: Layout) -> None:
    """No "float8" module under tensor parallelism: its linears are mimo's column- and row-parallel modules,
    which torchao does not convert (pure, before any collective)."""
    for name in float8_modules(cfg):
        if layout.grids[name].tp > 1:
            raise ConfigError(f"precision.module_dtype.{name} = \"float8\" with parallel.modules.{name}.tp = "
                              f"{layout.grids[name].tp}: FP8 linears do not compose with mimo's tensor-parallel "
                              f"linears yet; set parallel.modules.{name}.tp = 1 (FSDP and data parallelism work) or "
                              f"module_dtype.{name} = \"bfloat16\"")
