"""The one validation gate of a run: every user error is refused here, before `init_process_group` and the
first collective, as a `ConfigError` that names the field and the fix (`mimo: error:` on the command line).

`validate_run(cfg, world)` checks, in this order: the config alone (mimo.config.validate), the device (and
what a "float8" module needs of it: a GPU of compute capability >= 8.9, torchao), the architecture read from
every `hf_path`, the data set against the model (mimo.tasks: its modalities, row length, tokenizer), then, on
more than one rank, the layout (`check_layout`). `mimo plan` runs `check_layout` on every candidate. Before the
model's checks, on CUDA, the fast-path keys the user left unset take their GPU defaults where the layout
accepts them (mimo.perf.gpu_defaults), in the copy of the config the run trains with (the one change the gate
makes); what needs precision.dtype = "bfloat16" or precision.master_weights (a "float8" module, perf.grad_table) is
checked after them. Not collective (it reads only the files the config names), so every rank reaches the same
verdict. LM features a fast path would drop are refused on every world size (`check_lm_features`, e.g. Gemma 2's
logit soft-cap under the chunked loss). The blocks' fast paths and `perf.loss_rows_only` run on every layout; the
step's one-process keys are refused (`check_fast_path_layout`). Lower layers keep asserts for their own invariants
and never repeat these checks.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.distributed as dist

from mimo.config.schema import LANGUAGE, Config, ConfigError, ModelConfig
from mimo.config.validate import validate, validate_fast_path_keys, validate_float8_dtype
from mimo.data.chat import PromptFormatError, check_format
from mimo.data.image_text import IMAGE_TEXT_SETS
from mimo.data.tokenizer import IMAGE, ByteTokenizer, load_tokenizer, with_extra_tokens
from mimo.hf.build import extra_tokens_fix, resolve_hf_architecture
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import check_lm_features, validate_plan
from mimo.perf.apply import check_fast_path_layout
from mimo.perf.float8 import check_float8_support
from mimo.perf.gpu_defaults import FastPath, resolve_gpu_defaults
from mimo.tasks import data_set

BYTE_TEXT_IDS = ByteTokenizer.PAD + 1
"""The ids the byte tokenizer writes for text: bytes 0-255, BOS, EOS and PAD (placeholders come after)."""


def launch_world_size() -> int:
    """The number of ranks this process belongs to, known before joining them: the process group's size when
    one exists, else torchrun's WORLD_SIZE (1 outside torchrun)."""
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def validate_run(cfg: Config, world: int) -> tuple[Config, list[FastPath]]:
    """Every check of a run on `world` ranks, config first (see the module docstring). Returns the config the
    run trains with: `cfg` (left alone) with, on CUDA, the unset fast-path keys at their GPU defaults
    (mimo.perf.gpu_defaults), and (key, value, why) of each of those keys to print once.
    Not collective: every rank reaches the same verdict and values."""
    validate(cfg)
    check_device(cfg.train.device)
    check_float8_support(cfg)
    layout = Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world) if world > 1 else None
    checked = copy.copy(cfg)
    checked.model = resolved_model(cfg.model)
    checked, fast_paths = resolve_gpu_defaults(checked, layout)
    validate_float8_dtype(checked.precision)  # what needs precision.dtype or master_weights, now they are set
    validate_fast_path_keys(checked)
    check_lm_features(checked, layout.grids[LANGUAGE] if layout is not None else Grid())
    check_data_set(cfg, checked.model)
    check_tokenizer(cfg, checked.model)
    if layout is not None:
        check_layout(checked, layout)
    run = copy.copy(cfg)
    run.precision, run.perf = checked.precision, checked.perf
    return run, fast_paths


def check_device(device: str) -> None:
    """train.device names a device this torch build has."""
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise ConfigError(f"train.device = '{device}'; use \"cpu\" or \"cuda\" (\"cuda:N\" for one GPU)")
    if kind == "cuda" and not torch.cuda.is_available():
        why = "has no CUDA" if torch.version.cuda is None else "sees no GPU"
        raise ConfigError(f"train.device = '{device}' but this torch build ({torch.__version__}) {why}; use "
                          "train.device = \"cpu\", or a machine and torch build with CUDA")


def resolved_model(model: ModelConfig) -> ModelConfig:
    """A copy of `model` whose architecture fields come from its hf_path directories' config.json (as
    `build_model` resolves them), so the checks see the shapes the run will build."""
    if not model.llm.hf_path and not any(m.hf_path for m in model.modalities.values()):
        return model
    resolved = copy.deepcopy(model)
    try:
        resolve_hf_architecture(resolved)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return resolved


def row_length(cfg: Config, model: ModelConfig) -> int | None:
    """Tokens of every row the LM sees: the data set's own length (mimo.tasks.DATA_SETS); None when packing
    (validate_plan checks data.pack_length) or when the model lacks what the demo task needs (`mimo plan` may
    plan a model for other data)."""
    return None if cfg.data.packing else data_set(cfg).row_length(cfg, model)


def check_anyres_layout(cfg: Config, layout: Layout) -> None:
    """An anyres modality trains colocated with the LM, its tower replicated or sharded over data lanes only:
    its tiles are not split by tensor, context or pipeline parallelism, and no pipelined LM receives its rows."""
    for name, m in cfg.model.modalities.items():
        if not m.anyres_grid_pinpoints:
            continue
        grid, lm = layout.grids[name], layout.grids[LANGUAGE]
        split = [f"parallel.modules.{name}.{d} = {getattr(grid, d)}" for d in ("tp", "cp", "pp")
                 if getattr(grid, d) > 1]
        split += [f"parallel.modules.{LANGUAGE}.pp = {lm.pp}"] if lm.pp > 1 else []
        split += [f"parallel.modules.{name} on ranks of its own (non-colocated)"] if not layout.colocated else []
        if split:
            raise ConfigError(f"model.modalities.{name}.anyres_grid_pinpoints trains on colocated data-parallel "
                              f"layouts only, not with {split[0]}; lay the module out over dp alone, on the LM's "
                              "ranks, with an LM of pp = 1")


def check_data_set(cfg: Config, model: ModelConfig) -> None:
    """data.name is a known set (mimo.tasks.DATA_SETS) and the model fits it (its modalities, its rows);
    data.image_root is a folder."""
    data_set(cfg).check(cfg, model)
    if cfg.data.image_root and not os.path.isdir(cfg.data.image_root):
        raise ConfigError(f"data.image_root = '{cfg.data.image_root}' is no folder; name the folder the manifest's "
                          "relative image paths start from, or leave it empty for the manifest's own folder")


def data_tokenizer(cfg: Config) -> Any:
    """The tokenizer the data set writes text with (its registry entry's spec): none for synthetic ids,
    data.tokenizer for real data, the byte tokenizer for the demo tasks."""
    spec = data_set(cfg).tokenizer(cfg)
    if spec is None:
        return None
    if spec == "byte":
        return ByteTokenizer()
    folder = f"data.tokenizer = '{spec}'"
    if not os.path.isdir(spec):
        raise ConfigError(f"{folder} is no folder; use \"byte\" or a folder holding a Hugging Face tokenizer.json")
    if not any(name.startswith("tokenizer") for name in os.listdir(spec)):
        raise ConfigError(f"{folder} holds no tokenizer files; save one there (tokenizer.save_pretrained) or use "
                          "\"byte\"")
    try:
        return load_tokenizer(spec)
    except Exception as e:  # transformers and tokenizers raise many types for a damaged file
        raise ConfigError(f"{folder} cannot be read as a Hugging Face tokenizer ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); replace its tokenizer.json or use "
                          "\"byte\"") from None


def text_ids(tok: Any) -> tuple[int, set[int]]:
    """(how many ids the tokenizer has, the ids it writes for text): an HF tokenizer's whole vocabulary but
    its added tokens (except BOS, EOS, PAD and UNK) and its LLaVA "<image>" placeholder."""
    if isinstance(tok, ByteTokenizer):
        return BYTE_TEXT_IDS, set(range(BYTE_TEXT_IDS))
    vocab = tok.get_vocab()
    specials = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    markers = (set(tok.added_tokens_decoder) - specials) | {vocab.get(IMAGE)}
    return len(tok), set(vocab.values()) - markers


def check_tokenizer(cfg: Config, model: ModelConfig) -> None:
    """The data's tokenizer (with model.llm.extra_tokens added) lays out real data's chats in data.prompt_format,
    fits the LM's vocabulary and writes none of the placeholder or generation ids."""
    tok = run_data_tokenizer(cfg, model)
    if tok is None:
        return
    if cfg.data.name in IMAGE_TEXT_SETS:
        try:
            check_format(tok, cfg.data.prompt_format)
        except PromptFormatError as e:
            raise ConfigError(f"data.prompt_format = '{cfg.data.prompt_format}' with data.tokenizer = "
                              f"'{cfg.data.tokenizer}': {e}") from e
    size, produced = text_ids(tok)
    source = "the byte tokenizer" if isinstance(tok, ByteTokenizer) else f"the tokenizer in '{cfg.data.tokenizer}'"
    if size > model.llm.vocab:
        raise ConfigError(f"model.llm.vocab ({model.llm.vocab}) is smaller than {source} ({size} ids); set "
                          f"model.llm.vocab to at least {size}")
    full = size >= model.llm.vocab and bool(model.llm.hf_path)  # no free id: a new token is the way
    free = f"from {size} up to model.llm.vocab - 1{', e.g. 259-261' if size == BYTE_TEXT_IDS else ''}"
    for name, m in model.modalities.items():
        for field, tid in (("token_id", m.token_id), ("output_token_id", m.output_token_id)):
            if tid in produced:
                raise ConfigError(f"model.modalities.{name}.{field} ({tid}) is an id {source} writes for text, so "
                                  f"text would turn into {name} positions; use an id it never writes "
                                  + ("(it writes every id of model.llm.hf_path's vocabulary)"
                                     + extra_tokens_fix(model.llm) if full else f"({free})"))
        for field in ("vision_start_token_id", "vision_end_token_id"):
            tid = getattr(m.native, field) if m.kind == "native_vision" else -1
            if tid in produced:
                raise ConfigError(f"model.modalities.{name}.native.{field} ({tid}) is an id {source} writes for text, "
                                  f"so text could open or close an image; use an id it never writes ({free}), or -1 "
                                  "for no markers")


def run_data_tokenizer(cfg: Config, model: ModelConfig) -> Any:
    """`data_tokenizer` with model.llm.extra_tokens added at their ids (the resolved `model`'s), as the data, `mimo
    generate` and the export use it; refuses extra tokens the tokenizer cannot take."""
    tok = data_tokenizer(cfg)
    extra = model.llm.extra_token_ids
    if tok is None or not extra:
        return tok
    if isinstance(tok, ByteTokenizer):
        raise ConfigError(f"model.llm.extra_tokens adds tokens to a Hugging Face tokenizer, but data.name = "
                          f"'{cfg.data.name}' writes text with the byte tokenizer; train on real data with "
                          "data.tokenizer = the LM's tokenizer folder, or leave model.llm.extra_tokens empty")
    try:
        return with_extra_tokens(tok, extra, f"the tokenizer in '{cfg.data.tokenizer}'")
    except ValueError as e:
        raise ConfigError(f"model.llm.extra_tokens = {model.llm.extra_tokens}: {e}") from None


def check_checkpointable(cfg: Config, layout: Layout) -> None:
    """Every run ends in a sharded checkpoint. FSDP shards of tensor-parallel chunks are saved as 2-D DTensors
    over (tp, dp) (train/checkpoint/reshard.py), but not FSDP over cp x dp of TP chunks: refuse that module at
    start rather than at the end of its training."""
    for name, flags in cfg.parallel.modules.items():
        grid = layout.grids.get(name)
        if grid is not None and flags.fsdp and grid.tp > 1 and grid.cp > 1:
            raise ConfigError(f"parallel.modules.{name}: fsdp = true with tp = {grid.tp} and cp = {grid.cp} trains, "
                              "but its checkpoints (every run ends with one) cannot be saved: FSDP over cp x dp of "
                              f"tensor-parallel chunks is not checkpointable yet; set parallel.modules.{name}.fsdp = "
                              "false, tp = 1 or cp = 1")


def check_layout(cfg: Config, layout: Layout) -> None:
    """What `layout` needs of the model and the data, beyond the grids `Layout` checked itself: the parallel
    plan's rules (validate_plan), then sequence splits that must divide the rows and data lanes the colocated
    bridge can map. Pure, not collective."""
    validate_plan(cfg, layout)
    check_anyres_layout(cfg, layout)
    check_fast_path_layout(cfg, layout)
    check_checkpointable(cfg, layout)
    lm = layout.grids[LANGUAGE]
    lm_flags = cfg.parallel.modules.get(LANGUAGE)
    sp_tp = lm.tp if lm_flags is not None and lm_flags.sequence_parallel else 1
    factor = (2 * lm.cp if lm.cp > 1 else 1) * sp_tp
    rows = row_length(cfg, cfg.model)
    if rows is not None and rows % factor:
        raise ConfigError(f"the LM's rows of {rows} tokens (data.name = '{cfg.data.name}') must divide by {factor} "
                          f"(2 x cp x tp with sequence parallel, 2 x cp without) for parallel.modules.{LANGUAGE}; "
                          "choose a cp and tp whose split divides them, or a data.seq_len that is a multiple")
    for name, m in cfg.model.modalities.items():
        flags, tp = cfg.parallel.modules.get(name), layout.grids[name].tp
        if m.kind == "vision" and flags is not None and flags.sequence_parallel and m.vit.positions % tp:
            raise ConfigError(f"module '{name}': sequence parallel splits the ViT's {m.vit.positions} tokens "
                              f"(patches and class token, if any) over tp={tp}, which does not divide them; choose "
                              f"a tp that divides {m.vit.positions} or set parallel.modules.{name}.sequence_parallel "
                              "= false")
