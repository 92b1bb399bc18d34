"""`mimo export`: a run's newest (or named) checkpoint as a Hugging Face directory, the family chosen by its
config (LLaVA, LLaVA-NeXT / OneVision, Qwen2-VL / Qwen2.5-VL, or the LM alone), streamed tensor by tensor out
of the sharded checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from mimo.config.load import load_config
from mimo.data.chat import CHAT
from mimo.data.prompts import run_prompt_format
from mimo.data.tokenizer import run_tokenizer_spec
from mimo.export.hf import export_causal_lm, export_llava, llava_parts
from mimo.export.llava_next import export_llava_next
from mimo.export.qwen2_vl import export_qwen2_vl
from mimo.export.stream import CheckpointSource
from mimo.export.tokens import chat_tokenizer
from mimo.hf.build import build_model
from mimo.train.checkpoint.tensors import CheckpointTensors, resolve_checkpoint


def export_run(run: str | Path, to: str | Path, lm_only: bool = False, dtype: torch.dtype | None = None,
               max_shard_bytes: int | None = None) -> Path:
    """`mimo export`: a run's weights (its newest complete checkpoint, or the `checkpoints/step_*` folder
    passed) as a LLaVA directory (Qwen2-VL / Qwen2.5-VL for a native_vision modality, LLaVA-NeXT / OneVision for
    an anyres one), or with `lm_only` the LM as a causal LM; the run's tokenizer travels with it
    (`run_tokenizer_spec`), a LLaVA one with the chat template of a run's "chat" prompt format. Streams tensor
    by tensor from the sharded checkpoint: the model is built on the meta device for its names and shapes
    only, so the peak is about the largest tensor."""
    run_dir, step_dir = resolve_checkpoint(run)
    cfg = load_config(run_dir / "config.toml", saved_run=True)
    with torch.device("meta"):
        model = build_model(cfg.model, load_weights=False)
    tensors = CheckpointTensors(step_dir)
    prefixes = {id(m): f"{n}." for n, m in model.named_modules()}

    def source_of(module: nn.Module) -> CheckpointSource:
        return CheckpointSource(tensors, prefixes[id(module)])

    tok = run_tokenizer_spec(cfg.data.tokenizer, cfg.model.llm.hf_path)
    if lm_only:
        return export_causal_lm(model.language_model, to, dtype, tok, source_of, max_shard_bytes)
    if any(m.kind == "native_vision" for m in cfg.model.modalities.values()):
        return export_qwen2_vl(model, to, dtype, tok, source_of, max_shard_bytes)
    if any(m.anyres_grid_pinpoints for m in cfg.model.modalities.values()):
        return export_llava_next(model, to, dtype, tok, source_of, max_shard_bytes)
    if run_prompt_format(cfg) == CHAT:  # the export asks as training laid out chats
        tok = chat_tokenizer(tok, model.special_token_ids[llava_parts(model)[0]], cfg.model.llm.extra_token_ids)
    return export_llava(model, to, dtype, tok, source_of, max_shard_bytes)
