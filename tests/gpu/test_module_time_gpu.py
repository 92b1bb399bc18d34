"""summary.json's `time_share` on CUDA (mimo.train.module_time: CUDA events, read after the step): a sampled
step's events lie in order on the stream, each module's backward after the LM's, and a tiny demo run's shares sum
to 1 and move to the encoder when its work grows, eager and with compiled blocks."""

from __future__ import annotations

import json

import pytest
import torch

from mimo.models.build import build_model
from mimo.models.runtime import ModelRuntime
from mimo.train.module_time import ModuleTime
from mimo.train.trainer import Trainer
from tests.support.configs import image_text_batch, tiny_llm, tiny_vit, tiny_vlm
from tests.support.tiny_run import tiny_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = ["--train.device=cuda", "--perf.gpu_defaults=false", "--train.steps=8", "--metrics.throughput_warmup=2",
        "--metrics.time_share_every=1"]
LARGE_VIT = ["--model.modalities.images.vit.layers=8", "--model.modalities.images.vit.mlp=4096",
             "--model.modalities.images.vit.hidden=1024", "--model.modalities.images.vit.heads=8"]


def test_a_sampled_steps_events_lie_in_order():
    cfg = tiny_vlm(tiny_llm(), tiny_vit(layers=2), 60, {}, 1, 4)
    torch.manual_seed(0)
    model = build_model(cfg.model).cuda()
    clock = ModuleTime(torch.device("cuda"), every=1, warmup=0)
    model.set_runtime(ModelRuntime(module_clock=clock))
    batch = image_text_batch(torch.tensor([1, 0, 2, 1]), 16, 60, torch.Generator().manual_seed(0))
    args = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}
    args = {**{k: v.cuda() for k, v in args.items()},
            "modality_inputs": {"images": {"vit": {"pixel_values": batch["modality_inputs"]["images"]["vit"][
                "pixel_values"].cuda()}}}}
    assert clock.sample()
    model(**args).loss_sum.backward()
    torch.cuda.synchronize()
    s = {name: {kind: stamps[0] for kind, stamps in kinds.items()} for name, kinds in clock.stamps.items()}
    order = [s["images"]["forward_start"], s["images"]["forward_end"], s["language"]["forward_start"],
             s["language"]["forward_end"], s["language"]["backward_start"], s["language"]["backward_end"],
             s["images"]["backward_start"], s["images"]["backward_end"]]
    assert all(a.elapsed_time(b) >= 0 for a, b in zip(order, order[1:]))
    shares = clock.shares()
    assert shares.keys() == {"images", "language"} and abs(sum(shares.values()) - 1) < 1e-3


@pytest.mark.parametrize("compiled", [False, True])
def test_time_shares_on_cuda_sum_to_one_and_follow_the_encoders_work(tmp_path, compiled):
    extra = ["--perf.compile=true"] if compiled else []
    shares = []
    for name, vit in (("small", []), ("large", LARGE_VIT)):
        Trainer(tiny_config(tmp_path / name, *CUDA, *extra, *vit)).train()
        shares.append(json.loads((tmp_path / name / "tiny" / "summary.json").read_text())["time_share"])
    for share in shares:
        assert share.keys() == {"images", "language"} and abs(sum(share.values()) - 1) < 1e-3
    assert shares[1]["images"] > shares[0]["images"] + 0.1, shares
