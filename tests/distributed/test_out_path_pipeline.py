"""The Out path (text -> image, configs/demo_text_to_image.toml shrunk) on pipelined layouts, trained by `Trainer`
for three steps against one process on the same global batches: every step's loss and each modality's decoder
loss, every gradient, and the weights after the last step within 1e-5 relative (fp32, gloo).

The decoder runs where the LM's final states are, on the LM's last stage (mimo.parallel.pipeline.split's
`keep_out_path`); its loss joins the scaled text loss there, through the model's own `output_losses`. Layouts:
- LM pp2 with tied embeddings behind the image encoder's own rank (3 ranks);
- LM pp2 x dp2 behind an image encoder of dp1 (5 ranks): the decoder's gradients are summed over the last
  stage's data lanes and the output-token counts are global;
- LM dp2 behind an image encoder of dp2 (4 ranks; one LM stage, disjoint grids under the pipeline schedule);
- LM tp2 + SP x pp2 and LM cp2 x pp2 (5 ranks): the last stage's states are gathered whole
  (`ModelRuntime.gather_sequence`) and each TP or CP rank decodes the whole sequence;
- LM pp2 under interleaved 1F1B (2 virtual stages of a 4-layer LM, 3 ranks): the decoder runs after the last
  model chunk of the last stage.
Each layout runs as a whole run (`Trainer.train`: its final checkpoint holds the decoder, saved from the LM's
last stage; its summary says the evaluation is left to `mimo eval --run`, as on every pipelined layout).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.schema import Config
from mimo.train.trainer import Trainer
from tests.support.configs import T2I, TINY_T2I
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, rel_diff

RTOL = 1e-5
STEPS = 3
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
RUN = ["--run.name=tiny", "--metrics.progress=false", "--metrics.tensorboard=false", "--train.log_every=1",
       "--train.threads=1", "--optim.warmup_steps=1", "--optim.eps=1e-2", "--parallel.microbatches=2",
       f"--train.steps={STEPS}"]
OUT_PATH = [*TINY_T2I, *RUN, "--model.llm.heads=4", "--model.llm.kv_heads=2", "--model.llm.layers=2",
            "--data.train_samples=32", "--data.eval_samples=2", "--data.global_batch=8"]
TIED = "--model.llm.tie_embeddings=true"
LAYERS4 = "--model.llm.layers=4"
CASES = {
    "lm_pp2_tied": (3, [TIED], [f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2"]),
    "lm_pp2_dp2": (5, [], [f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=4", f"{LANG}.pp=2"]),
    "images_dp2_lm_dp2": (4, [], [f"{IMG}.size=2", f"{LANG}.offset=2", f"{LANG}.size=2"]),
    "lm_tp2_sp_pp2": (5, [], [f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=4", f"{LANG}.pp=2",
                              f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true"]),
    "lm_cp2_pp2": (5, [], [f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=4", f"{LANG}.pp=2", f"{LANG}.cp=2"]),
    "lm_pp2_interleaved": (3, [LAYERS4], [f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2",
                                          f"{LANG}.virtual_stages=2"]),
}


def _config(out: Path, *overrides: str) -> Config:
    return load_config(T2I, [*OUT_PATH, f"--run.out_dir={out}", *overrides])


def _capture(trainer: Trainer) -> list[dict]:
    """The list that each step's gradients (unsharded, on rank 0 under a layout) go to, as the optimizer gets them."""
    grads: list[dict] = []
    update = trainer.update

    def capture(step: int, loss: float) -> dict:
        grads.append(trainer.plan.gather_full(trainer.model, grads=True))
        return update(step, loss)

    trainer.update = capture
    return grads


def _result(trainer: Trainer, records: list[dict], grads: list[dict], summary: dict | None) -> dict:
    params = trainer.plan.gather_full(trainer.model)
    return {"records": records, "grads": [{n: g.numpy() for n, g in s.items()} for s in grads],
            "params": {n: p.numpy() for n, p in params.items()}, "summary": summary}


def _reference(out: Path, *overrides: str) -> dict:
    """One process, step by step (its end-of-run evaluation, the judge's fit, is not what is compared)."""
    trainer = Trainer(_config(out, *overrides))
    grads = _capture(trainer)
    return _result(trainer, [trainer.train_step(step) for step in range(STEPS)], grads, None)


def _rank(rank: int, world: int, out: str, overrides: list[str]) -> dict:
    """The whole run (`Trainer.train`: steps, final checkpoint, end-of-run evaluation, summary); rank 0's
    records are its metrics.jsonl lines."""
    trainer = Trainer(_config(Path(out), *overrides))
    grads = _capture(trainer)
    summary = trainer.train()
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines() if rank == 0 else []
    records = [r for r in map(json.loads, lines) if "images_out_loss" in r]
    return _result(trainer, records, grads, summary)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, dict]:
    threads = torch.get_num_threads()
    models = {tuple(model) for _, model, _ in CASES.values()}
    yield {model: _reference(tmp_path_factory.mktemp("ref"), *model) for model in sorted(models)}
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", list(CASES))
def test_out_path_on_a_pipelined_layout_trains_like_single_process(references, tmp_path, case):
    world, model, layout = CASES[case]
    run = run_distributed(_rank, world, str(tmp_path), [*model, *layout], timeout=600)[0]
    ref = references[tuple(model)]
    loss = [r["loss"] for r in run["records"]]
    assert_trains_like(case, (loss, run["grads"]), ([r["loss"] for r in ref["records"]], ref["grads"]), RTOL)
    for step, (got, want) in enumerate(zip(run["records"], ref["records"])):
        assert abs(got["images_out_loss"] - want["images_out_loss"]) <= RTOL * want["images_out_loss"], step
        assert got["loss"] > got["images_out_loss"] > 0, f"{case} step {step}: the decoder loss joins the loss"
    assert any("decoders" in n and abs(g).max() > 0 for n, g in run["grads"][0].items()), case
    assert run["params"].keys() == ref["params"].keys(), case
    for name, p in run["params"].items():
        r = rel_diff(torch.as_tensor(p), torch.as_tensor(ref["params"][name]))
        if name.endswith("k_proj.bias") and not name.startswith("language_model."):  # see assert_trains_like
            weight = torch.as_tensor(ref["params"][name[: -len("bias")] + "weight"])
            r = (torch.as_tensor(p) - torch.as_tensor(ref["params"][name])).abs().max() / weight.abs().max()
        assert r <= RTOL, f"{case}: weight {name} after {STEPS} steps off by {r:.2e} relative"
    summary = run["summary"]
    assert summary["steps"] == STEPS and summary["checkpoint"], summary
    assert "mimo eval --run" in summary["eval"]["skipped"], summary["eval"]
