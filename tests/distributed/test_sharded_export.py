"""No gather anywhere: a 2-rank tensor-parallel run ends in a sharded checkpoint, and `mimo export` streams
it into a Hugging Face LLaVA directory whose logits in `transformers` equal the single-process run's export
(fp32, within 1e-6). While the ranks write their final weights, the bytes all their collectives move stay a
small fraction of the model (the plans DCP exchanges: metadata, no weights); the export holds at most one
tensor read from the checkpoint at a time (checked with weak references)."""

from __future__ import annotations

import pickle
import weakref

import pytest
import torch
import torch.distributed as dist

from mimo.export.run import export_run
from mimo.train.checkpoint import tensors as checkpoint_tensors
from mimo.train.checkpoint.weights import load_run
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.hf_helpers import exported_logits, rel_diff
from tests.support.tiny_run import tiny_config

LAYOUT = ["--parallel.modules.language.tp=2", "--parallel.modules.images.tp=2"]
RUN = ["--train.steps=2", "--optim.eps=1e-2", "--model.llm.heads=2", "--model.llm.kv_heads=2"]
TENSOR_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "gather", "broadcast", "all_reduce", "reduce_scatter",
                      "reduce_scatter_tensor", "scatter", "all_to_all_single", "send", "recv")
OBJECT_COLLECTIVES = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list")


def _bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _record(moved: list[int], module=dist) -> list:
    """Wrap the collectives of torch.distributed so every call adds the bytes it moves to `moved`."""
    undo = []
    for name in TENSOR_COLLECTIVES + OBJECT_COLLECTIVES:
        fn = getattr(module, name)

        def wrapped(*args, _fn=fn, _name=name, **kwargs):
            objects = _name in OBJECT_COLLECTIVES
            moved.append(len(pickle.dumps(args[:2])) if objects else sum(_bytes(a) for a in args[:2]))
            return _fn(*args, **kwargs)

        setattr(module, name, wrapped)
        undo.append((name, fn))
    return undo


def _train_tp(rank: int, world: int, out: str) -> dict:
    trainer = Trainer(tiny_config(out, *RUN, *LAYOUT))
    model_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    moved: list[int] = []
    save_final = trainer.checkpointer.save_final

    def watched(steps: int):
        undo = _record(moved)
        try:
            return save_final(steps)
        finally:
            for name, fn in undo:
                setattr(dist, name, fn)

    trainer.checkpointer.save_final = watched
    summary = trainer.train()
    return {"held_bytes": model_bytes, "moved": sum(moved), "checkpoint": summary["checkpoint"]}


@pytest.mark.usefixtures("one_thread")
def test_tp2_run_exports_the_single_process_logits_without_a_gather(tmp_path, monkeypatch):
    ref_summary = Trainer(tiny_config(tmp_path / "ref", *RUN)).train()
    ranks = run_distributed(_train_tp, 2, str(tmp_path / "tp"), timeout=300)
    whole = sum(t.numel() * 4 for t in load_run(ref_summary["checkpoint"])[1].state_dict().values())
    for r in ranks:
        assert r["held_bytes"] < 0.8 * whole, "each TP rank holds its slices, not the model"
        assert r["moved"] < 0.1 * whole, f"the final save moved {r['moved']} bytes (model: {whole}): a gather"

    alive: list[weakref.ref] = []
    read = checkpoint_tensors.CheckpointTensors.read

    def one_at_a_time(self, name):
        live = [w for w in alive if w() is not None]
        assert len(live) <= 1, f"{len(live)} checkpoint tensors alive while reading '{name}'"
        t = read(self, name)
        alive.append(weakref.ref(t))
        return t

    monkeypatch.setattr(checkpoint_tensors.CheckpointTensors, "read", one_at_a_time)
    single = export_run(ref_summary["checkpoint"], tmp_path / "single_hf", max_shard_bytes=16 * 1024)
    sharded = export_run(tmp_path / "tp" / "tiny", tmp_path / "tp_hf", max_shard_bytes=16 * 1024)
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 1
    assert rel_diff(exported_logits(sharded), exported_logits(single)) <= 1e-6
