"""Packing native-resolution data: each sample keeps its M-RoPE positions (three axes, restarting at 0 in its
document) and its images or video, so a packed step trains exactly the unpacked samples (loss and every gradient,
fp32), and `mimo train` packed logs the unpacked run's losses.

The batch: images of four sizes, a sample of two images of different sizes, a 3-frame video, a text-only sample
and a skipped one (tests.support.native_data), 8 rows of 160 tokens packed into 2."""

import json

import pytest
import torch

from mimo.config.load import load_config
from mimo.data.batching import COUNTS
from mimo.data.chat import special_ids
from mimo.data.packing import first_fit, pack_batch, sample_lengths
from mimo.models.build import build_model
from mimo.models.step_hints import forward_args
from mimo.tasks import build_demo_data
from tests.support.configs import CONFIGS
from tests.support.export_run import cli
from tests.support.native_data import TINY, manifest
from tests.support.parity import close

pytestmark = pytest.mark.usefixtures("one_thread")
ROW = 160
BATCH = ["--data.global_batch=8", "--model.llm.kv_heads=2", "--model.llm.layers=2"]


def _setup(tmp_path):
    """The tiny native model (fp32, seed 0), its first global batch and the pad id."""
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, *BATCH, f"--data.path={manifest(tmp_path, True)}"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    data = build_demo_data(cfg, model)
    return model, data.global_batch(0, 8, cfg.data.seed), special_ids(data.tok)[2]


def _visual(batch: dict) -> dict:
    return batch["modality_inputs"]["images"]["visual"]


def test_packed_rows_keep_each_samples_positions_and_items(tmp_path):
    _, batch, pad = _setup(tmp_path)
    packed, _ = pack_batch(batch, pad, ROW)
    lengths = sample_lengths(batch["input_ids"], batch["labels"], pad).tolist()
    rows = first_fit(lengths, ROW)
    assert len(rows) == 2 and packed["position_ids"].shape == (2, ROW, 3)
    grids, counts = _visual(batch)["grid_thw"], batch[COUNTS]["images"].tolist()
    starts = [sum(counts[:i]) for i in range(len(counts))]
    assert {tuple(g) for g in grids.tolist()} >= {(1, 4, 8), (1, 12, 4), (2, 6, 8)}  # two sizes and the video
    assert 0 in counts[1:]  # a text-only sample beside the skipped one
    order = [i for members in rows for i in members]
    expected = [grids[starts[i] + j].tolist() for i in order for j in range(counts[i])]
    assert _visual(packed)["grid_thw"].tolist() == expected  # every item follows its sample
    assert packed[COUNTS]["images"].tolist() == [sum(counts[i] for i in members) for members in rows]
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            k = lengths[i]
            assert torch.equal(packed["position_ids"][r, at:at + k], batch["position_ids"][i, :k])
            assert k == 0 or packed["position_ids"][r, at].tolist() == [0, 0, 0]  # M-RoPE restarts per document
            at += k
        tail = torch.arange(ROW - at)[:, None].expand(-1, 3)
        assert torch.equal(packed["position_ids"][r, at:], tail)


def test_packed_native_step_equals_unpacked_step(tmp_path):
    model, batch, pad = _setup(tmp_path)
    results = []
    for b in (batch, pack_batch(batch, pad, ROW)[0]):
        model.zero_grad()
        out = model(**forward_args({k: v for k, v in b.items() if k != COUNTS}))
        loss = out.loss_sum / out.num_tokens
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (ref_loss, ref), (loss, grads) = results
    close("loss", loss, ref_loss, 1e-5)
    assert grads.keys() == ref.keys() and any(n.startswith("modality_submodules.images") for n in ref)
    for name, g in ref.items():
        close(name, grads[name], g, 1e-5)


def test_mimo_train_packed_on_native_data_logs_the_unpacked_losses(tmp_path, capsys):
    data = manifest(tmp_path, several=True)
    runs = {}
    for name, extra in (("padded", []), ("packed", ["--data.packing=true", f"--data.pack_length={ROW}"])):
        cli(capsys, "train", CONFIGS / "native_qwen2_5_vl.toml", *TINY, *BATCH, f"--data.path={data}",
            "--train.steps=3", f"--run.out_dir={tmp_path / 'runs'}", f"--run.name={name}", *extra)
        folder = tmp_path / "runs" / name
        runs[name] = [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "runs" / "packed" / "summary.json").read_text())
    assert summary["padding"]["padding_after"] < summary["padding"]["padding_before"]
    assert len(runs["packed"]) == 3
    for step, (a, b) in enumerate(zip(runs["packed"], runs["padded"], strict=True)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: packed {a} vs unpacked {b}"
