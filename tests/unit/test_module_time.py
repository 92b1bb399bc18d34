"""summary.json's `time_share` (mimo.train.module_time): the stamps bracket each module's forward and its whole
backward (checked against the moment each of its parameters' gradients lands), and a run's shares sum to 1 and
move to the encoder when its work grows."""

from __future__ import annotations

import json
import time

import torch

from mimo.models.build import build_model
from mimo.models.runtime import ModelRuntime
from mimo.train.module_time import ModuleTime
from mimo.train.trainer import Trainer
from tests.support.configs import image_text_batch, tiny_llm, tiny_vit, tiny_vlm
from tests.support.tiny_run import tiny_config

IMAGES = [1, 0, 2, 1]


def test_the_stamps_bracket_each_modules_forward_and_whole_backward():
    cfg = tiny_vlm(tiny_llm(), tiny_vit(layers=2), 60, {}, 1, len(IMAGES))
    torch.manual_seed(0)
    model = build_model(cfg.model)
    clock = ModuleTime(torch.device("cpu"), every=2, warmup=1)
    model.set_runtime(ModelRuntime(module_clock=clock))
    landed: dict[str, float] = {}

    def land(name: str) -> None:
        landed[name] = time.perf_counter()

    for name, p in model.named_parameters():
        if "embed_tokens" not in name:  # the text embedding runs outside both modules
            p.register_post_accumulate_grad_hook(lambda p, name=name: land(name))
    batch = image_text_batch(torch.tensor(IMAGES), 16, 60, torch.Generator().manual_seed(0))
    args = {k: batch[k] for k in ("input_ids", "labels", "position_ids", "modality_inputs")}
    assert [clock.sample() for _ in range(4)] == [False, True, False, True]
    model(**args).loss_sum.backward()
    spans = {name: {kind: stamps[0] for kind, stamps in kinds.items()} for name, kinds in clock.stamps.items()}
    assert all(len(stamps) == 1 for kinds in clock.stamps.values() for stamps in kinds.values())
    assert set(spans) == {"images", "language"}
    for s in spans.values():
        assert s["forward_start"] < s["forward_end"] <= s["backward_start"] < s["backward_end"]
    assert spans["images"]["forward_end"] < spans["language"]["forward_start"]
    assert spans["language"]["backward_end"] <= spans["images"]["backward_start"]
    module_of = {"modality_submodules.images.": "images", "language_model.": "language"}
    for name, at in landed.items():
        s = spans[next(m for prefix, m in module_of.items() if name.startswith(prefix))]
        assert s["backward_start"] < at < s["backward_end"], name
    assert landed.keys() == {n for n, _ in model.named_parameters() if "embed_tokens" not in n}
    shares = clock.shares()
    assert shares.keys() == {"images", "language"} and abs(sum(shares.values()) - 1) < 1e-3
    assert clock.stamps == {}
    with torch.no_grad():  # an evaluation inside a timed step is not stamped
        model(**args)
    assert clock.stamps == {}


def _graph_nodes(root) -> list[str]:
    """The type names of every node of the autograd graph behind `root`, sorted."""
    seen, stack, names = set(), [root], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return sorted(names)


def test_a_step_that_is_not_sampled_adds_no_autograd_node_and_no_stamp():
    cfg = tiny_vlm(tiny_llm(), tiny_vit(layers=2), 60, {}, 1, len(IMAGES))
    torch.manual_seed(0)
    model = build_model(cfg.model)
    batch = image_text_batch(torch.tensor(IMAGES), 16, 60, torch.Generator().manual_seed(0))
    args = {k: batch[k] for k in ("input_ids", "labels", "position_ids", "modality_inputs")}
    plain = _graph_nodes(model(**args).loss_sum.grad_fn)  # no clock at all: the oracle
    clock = ModuleTime(torch.device("cpu"), every=2, warmup=1)
    model.set_runtime(ModelRuntime(module_clock=clock))
    assert clock.sample() is False
    assert _graph_nodes(model(**args).loss_sum.grad_fn) == plain
    assert clock.stamps == {}
    assert clock.sample() is True  # a sampled step does add its nodes (the check above can see them)
    assert len(_graph_nodes(model(**args).loss_sum.grad_fn)) > len(plain)


def _time_share(out, *overrides: str) -> dict[str, float]:
    Trainer(tiny_config(out, "--train.steps=6", "--metrics.throughput_warmup=1", "--metrics.time_share_every=1",
                        *overrides)).train()
    return json.loads((out / "tiny" / "summary.json").read_text())["time_share"]


def test_a_runs_time_shares_sum_to_one_and_follow_the_encoders_work(tmp_path):
    small = _time_share(tmp_path / "small")
    large = _time_share(tmp_path / "large", "--model.modalities.images.vit.layers=8",
                        "--model.modalities.images.vit.mlp=1024", "--model.modalities.images.vit.hidden=128")
    for shares in (small, large):
        assert shares.keys() == {"images", "language"} and abs(sum(shares.values()) - 1) < 1e-3
    assert large["images"] > small["images"] + 0.1, (small, large)
