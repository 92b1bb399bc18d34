"""`model.llm.extra_tokens` on sharded layouts: a VLM over an LM whose tokenizer writes every id of its vocabulary,
its `<image>` placeholder added by the key, trains on tp2 (the vocabulary-parallel embedding and head split the
grown rows), on FSDP2 and pipelined (embedding and head on different stages) with the losses and, gathered whole,
the weights of one process (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.full_vocab import full_vocab_overrides, full_vocab_run
from tests.support.tiny_run import metrics, tiny_config

LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
LAYOUTS = {"tp2": (2, [f"{LANG}.tp=2", f"{IMG}.tp=2"]), "fsdp2": (2, [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"]),
           "pipeline3": (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2",
                             f"{LANG}.pp=2", "--parallel.microbatches=2"])}
STEPS = ["--train.steps=3"]


def _train(rank: int, world: int, out: str, overrides: list[str]) -> dict:
    trainer = Trainer(tiny_config(out, *overrides))
    trainer.train()
    return {n: t.numpy() for n, t in trainer.plan.gather_full(trainer.model).items()}


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    return full_vocab_run(tmp_path_factory.mktemp("full_vocab"))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_grown_vocabulary_trains_on_sharded_layouts_as_on_one_process(tmp_path, run_files, layout):
    overrides = [*full_vocab_overrides(*run_files), *STEPS]
    ref = Trainer(tiny_config(tmp_path / "ref", *overrides))
    ref.train()
    ref_losses = [r["loss"] for r in metrics(tmp_path / "ref") if "loss" in r]
    world, flags = LAYOUTS[layout]
    got = run_distributed(_train, world, str(tmp_path / layout), [*overrides, *flags], timeout=300)[0]
    losses = [r["loss"] for r in metrics(tmp_path / layout) if "loss" in r]
    assert len(ref_losses) == 3 and losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-5)
    emb = ref.model.language_model.embed_tokens.weight
    assert emb.shape[0] == 64
    for name, p in ref.model.named_parameters():
        assert torch.allclose(torch.from_numpy(got[name]), p.detach(), rtol=1e-5, atol=1e-5), (layout, name)
