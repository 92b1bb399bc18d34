"""Corrupt real-data samples on several ranks: every rank that reads data reaches the same verdict on a
batch before the step's first collective, so a sample only one rank decodes is skipped (or stops the run)
everywhere, never raised on one rank while the others wait in a collective. On DP2 and on pipelines (the
8-rank demo_pipeline layout, where only first and last stages read data: they agree among themselves and
the pipeline's step tells the others). Checked against one process on the same samples: the losses of a
whole epoch, the data report and the held-out loss."""

from __future__ import annotations

from pathlib import Path

from mimo.config.load import load_config
from mimo.config.schema import Config
from mimo.data.make_shards import main as make_shards_main
from mimo.data.tokenizer import ByteTokenizer
from mimo.train.held_out import evaluate_held_out
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.data_folders import data_overrides, make_folder, write_manifest
from tests.support.dist import run_distributed
from tests.support.tiny_run import TINY, tiny_config

PLACEHOLDER = 259  # the demo config's images token_id
STEPS = 5  # 5 steps x 8 = one epoch of the N = 40 samples: each sample is seen once


class HashIsPlaceholder(ByteTokenizer):
    """The byte tokenizer, except that '#' encodes to the images placeholder id, as a tokenizer with an
    `<image>` token does for a caption holding that text, and that '!' makes it raise, as a tokenizer's
    own bug would."""

    def encode(self, text: str) -> list[int]:
        if "!" in text:
            raise KeyError("a tokenizer bug")
        return [PLACEHOLDER if b == ord("#") else b for b in text.encode("utf-8")]


# The tiny model on demo_pipeline.toml's 8 ranks: encoder tp2 on ranks 0-1, LM tp2 x pp3 on ranks 2-7 (ranks 4-5,
# its middle stage, read no data); and a 4-rank pipeline whose LM middle stage (rank 2) reads none either.
PIPELINE_MODEL = ["--model.llm.layers=3", "--model.llm.kv_heads=2"]
PIPELINE4 = ["--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
             "--parallel.modules.language.offset=1", "--parallel.modules.language.size=3",
             "--parallel.modules.language.pp=3", "--parallel.microbatches=2"]


def pipeline8_config(out: Path, *overrides: str) -> Config:
    return load_config(CONFIGS / "demo_pipeline.toml", [*TINY, f"--run.out_dir={out}", *overrides])


def _trainer(out: Path, manifest: Path, *overrides: str, pipeline8: bool = False) -> Trainer:
    name = "webdataset" if manifest.is_dir() else "jsonl"
    extra = data_overrides(name, manifest, f"--train.steps={STEPS}", *overrides)
    tr = Trainer(pipeline8_config(out, *extra) if pipeline8 else tiny_config(out, *extra))
    tr.data.tok = HashIsPlaceholder()  # read by the samples' decoder when the first step starts
    return tr


def _epoch(rank: int, world: int, out: str, data: str, *overrides: str, pipeline8: bool = False) -> tuple:
    """An epoch's losses, the data report and the held-out loss after it (held-out data where overrides name it)."""
    tr = _trainer(Path(out), Path(data), *overrides, pipeline8=pipeline8)
    losses = [tr.train_step(s)["loss"] for s in range(STEPS)]
    held_out = evaluate_held_out(tr.cfg, tr.model, tr.data, tr.plan, tr.device)
    return losses, tr.data.report(), held_out


def _failing_step(rank: int, world: int, out: str, manifest: str, *overrides: str) -> str:
    tr = _trainer(Path(out), Path(manifest), *overrides)
    try:
        for s in range(STEPS):
            tr.train_step(s)
    except (RuntimeError, ValueError) as e:
        return str(e)
    return "no error"


def close(a: list[float], b: list[float]) -> bool:
    return all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(a, b, strict=True))


def test_wrong_placeholder_count_on_one_rank_is_skipped_on_both(tmp_path):
    # sample 12's caption gives one placeholder too many; only the rank whose LM lane holds it decodes its text
    manifest = write_manifest(tmp_path, {12: "a # too many"})
    one = _trainer(tmp_path / "one", manifest)
    expected = [one.train_step(s)["loss"] for s in range(STEPS)]
    assert one.data.report()["corrupt_samples"] == 3  # samples 7, 23 (images) and 12 (placeholders)
    results = run_distributed(_epoch, 2, str(tmp_path / "two"), str(manifest), timeout=300)
    for losses, report, _ in results:
        assert report == one.data.report()
        assert close(losses, expected), (expected, losses)


def test_unexpected_sample_error_stops_both_ranks_with_its_message(tmp_path):
    manifest = write_manifest(tmp_path, {30: "tokenizer breaks here!"})
    messages = run_distributed(_failing_step, 2, str(tmp_path / "two"), str(manifest), timeout=300)
    own = [m for m in messages if "sample 'line 31' failed to load: KeyError('a tokenizer bug')" in m]
    pointer = [m for m in messages if "failed to load on another rank" in m]
    assert len(own) == 1 and len(pointer) == 1, messages


def shards(root: Path, placeholder_caption: bool) -> Path:
    """make_folder's N samples (7 and 23 with broken images) as 3 WebDataset shards; with `placeholder_caption`
    sample 13's caption (a .txt) gives one placeholder too many."""
    src = make_folder(root)
    if placeholder_caption:
        (src / "sub" / "img.013.txt").write_text("a # too many")
    make_shards_main([str(src), str(root / "shards"), "--samples-per-shard", "16"])
    return root / "shards"


def test_webdataset_with_corrupt_samples_trains_on_the_8_rank_pipeline(tmp_path):
    train = shards(tmp_path / "train", placeholder_caption=True)
    held_out = [*PIPELINE_MODEL, "--data.eval_samples=16", f"--data.eval_path={shards(tmp_path / 'held_out', False)}"]
    expected, report, evaluation = _epoch(0, 1, str(tmp_path / "one"), str(train), *held_out)
    assert report["corrupt_samples"] == 3 and evaluation["tokens"] > 0
    results = run_distributed(_epoch, 8, str(tmp_path / "eight"), str(train), *held_out, pipeline8=True,
                              timeout=600)
    readers = [0, 1, 2, 3, 6, 7]  # the encoder's stage, the LM's first and last stages
    for rank in readers:
        losses, rank_report, rank_eval = results[rank]
        assert close(losses, expected), (rank, losses, expected)
        assert rank_report == report, (rank, rank_report)
    for losses, _, rank_eval in results:  # every rank gets the step's loss and the held-out loss
        assert close(losses, expected) and close([rank_eval["loss"]], [evaluation["loss"]])
        assert rank_eval["tokens"] == evaluation["tokens"]


def test_unexpected_sample_error_stops_every_pipeline_rank(tmp_path):
    manifest = write_manifest(tmp_path, {30: "tokenizer breaks here!"})
    messages = run_distributed(_failing_step, 4, str(tmp_path / "four"), str(manifest), *PIPELINE_MODEL, *PIPELINE4,
                               timeout=300)
    for rank, message in enumerate(messages):  # rank 2, the LM's middle stage, reads no data and hears it too
        assert "sample 'line 31' failed to load: KeyError('a tokenizer bug')" in message, (rank, message)
