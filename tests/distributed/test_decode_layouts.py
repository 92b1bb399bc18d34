"""The end-of-run evaluation on layouts that split the LM's sequence (LM tp2 + sequence parallel, LM cp2, LM
cp2 x tp2 + sequence parallel) runs in the training layout (mimo.parallel.decoding) and equals one process:
each case trains the tiny shapes demo for a few steps under `Trainer`, then its summary's `eval` must equal
`mimo eval`'s single-process evaluation of the run folder's final weights, and every held-out prompt's greedy
tokens decoded on the sharded model must equal those of the single-process model, token for token. After
decoding the layout is as trained (sequence parallel and CP attention back on). The text-to-image demo (the Out
path: one forward, then the image decoder) is checked the same way on LM cp2 (about 75 s, most of it the
evaluation's judge, fitted on every rank; LM tp2 + sequence parallel passes too, left out for time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mimo.config.load import load_config
from mimo.data.batching import to_device
from mimo.models.generate import greedy_generate
from mimo.models.layers import SelfAttention
from mimo.parallel.decoding import whole_sequences
from mimo.parallel.tensor_layers import RowParallelLinear
from mimo.tasks import build_demo_data, evaluate_demo
from mimo.train.checkpoint.weights import load_run
from mimo.train.trainer import Trainer
from tests.support.configs import T2I, TINY_T2I
from tests.support.dist import run_distributed
from tests.support.tiny_run import tiny_config

LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
SP = [f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true"]
RUN = ["--model.llm.kv_heads=2", "--data.eval_samples=8", "--train.steps=3", "--optim.lr=3e-3"]
CASES = {  # the encoder's DP degree equals the LM's, so no bridge crosses data lanes
    "lm_tp2_sp": (2, [*SP, f"{IMG}.tp=2"]),
    "lm_cp2": (2, [f"{LANG}.cp=2", f"{IMG}.tp=2"]),
    "lm_cp2_tp2_sp": (4, [*SP, f"{LANG}.cp=2", f"{IMG}.tp=4", "--model.modalities.images.vit.heads=4"]),
}

OUT_PATH = [*TINY_T2I, "--model.llm.heads=4", "--model.llm.kv_heads=2", "--data.train_samples=16",
            "--data.eval_samples=4", "--data.global_batch=4", "--train.steps=2", "--run.name=tiny",
            "--metrics.progress=false", "--metrics.tensorboard=false", "--train.threads=1"]


def greedy_tokens(model, data) -> list[list[int]]:
    """Each held-out prompt's greedy tokens, decoded one prompt at a time."""
    out = []
    for s in data.eval:
        inputs = to_device(data.collate([s])["modality_inputs"], torch.device("cpu"))
        out += greedy_generate(model, torch.tensor([data.prompt_ids(s)]), inputs, max_new_tokens=12,
                               eos_id=data.tok.EOS)
    return out


def train_then_decode(rank: int, world: int, out_dir: str, overrides: list[str]) -> dict:
    trainer = Trainer(tiny_config(Path(out_dir), *overrides))
    summary = trainer.train()
    plan, model = trainer.plan, trainer.model
    with torch.no_grad(), whole_sequences(plan, model):
        tokens = greedy_tokens(model, trainer.data)
    rows = [m for m in model.language_model.modules() if isinstance(m, RowParallelLinear)]
    if SP[1] in overrides:
        assert rows and all(m.sequence_parallel for m in rows)
    assert model.runtime.shard_sequence is not None
    if plan.context is not None:
        layers = [m for m in model.language_model.modules() if isinstance(m, SelfAttention)]
        assert layers and all(m.layout_attention == plan.context.attend for m in layers)
    return {"summary": summary, "tokens": tokens}


@pytest.mark.parametrize("case", sorted(CASES))
def test_end_of_run_eval_in_the_training_layout_equals_one_process(tmp_path, case):
    world, layout = CASES[case]
    results = run_distributed(train_then_decode, world, str(tmp_path), [*RUN, *layout], timeout=300)
    cfg, model = load_run(tmp_path / "tiny")
    data = build_demo_data(cfg, model)
    expected = evaluate_demo(cfg, model, data, "cpu")
    summary = results[0]["summary"]
    assert "skipped" not in summary["eval"], summary["eval"]
    assert summary["eval"] == expected
    reference = greedy_tokens(model, data)
    for rank, r in enumerate(results):
        assert r["tokens"] == reference, f"rank {rank}"


def train_out_path(rank: int, world: int, out_dir: str, overrides: list[str]) -> dict:
    return Trainer(load_config(T2I, [*OUT_PATH, f"--run.out_dir={out_dir}", *overrides])).train()


@pytest.mark.slow
def test_end_of_run_out_path_eval_under_lm_cp2_equals_one_process(tmp_path):
    summary = run_distributed(train_out_path, 2, str(tmp_path), [f"{LANG}.cp=2", f"{IMG}.tp=2"], timeout=300)[0]
    cfg, model = load_run(tmp_path / "tiny")
    expected = evaluate_demo(cfg, model, build_demo_data(cfg, model), "cpu")
    assert "skipped" not in summary["eval"], summary["eval"]
    assert summary["eval"] == expected
