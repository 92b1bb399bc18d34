"""The layout benchmark's pure parts: the sequence length of a preset, its layout names and defaults, and the
failure and profile tables it prints."""

import argparse

import pytest

from benchmarks.bench_layouts import default_layouts, parse_layout, plan_runs, profile_table
from benchmarks.launch import failure
from benchmarks.workload import baseline_module, images_seq_len


def test_sequence_length_keeps_the_presets_text():
    p = baseline_module().load_preset("small")
    assert images_seq_len(p, 1) == 2048 and images_seq_len(p, 4) == 4 * 576 + 2048 - 576 == 3776


def _modules(name: str, world: int) -> dict:
    layout = parse_layout(name, world)
    return {m: (c.offset, c.size, c.tp, c.pp) for m, c in layout.parallel.modules.items()}


def test_layout_names():
    assert parse_layout("dp", 2).kind == parse_layout("tp", 2).kind == "homogeneous"
    assert _modules("enc-dp_lm-tp", 2) == {"images": (0, 2, 1, 1), "language": (0, 2, 2, 1)}
    assert parse_layout("enc-dp_lm-tp", 2).kind == "colocated"
    assert parse_layout("enc-tp2dp4_lm-tp2", 8).kind == "homogeneous"
    pipe = parse_layout("pipe", 2)
    assert pipe.kind == "pipelined" and pipe.parallel.microbatches == 4
    assert _modules("pipe", 2) == {"images": (0, 1, 1, 1), "language": (1, 1, 1, 1)}
    assert _modules("pipe", 8) == _modules("pipe-enc2_lm6", 8) == {"images": (0, 2, 1, 1), "language": (2, 6, 1, 1)}
    assert _modules("pipe-enc2-tp2_lm6-tp2pp3", 8) == {"images": (0, 2, 2, 1), "language": (2, 6, 2, 3)}
    layout = parse_layout("enc-tp2sp_lm-fsdp", 4).parallel.modules
    assert layout["images"].sequence_parallel and layout["language"].fsdp
    for bad, message in (("tp3", "does not fill its 2 ranks"), ("pipe-enc1_lm2", "add up to the 2 ranks"),
                         ("tpdp", "at most one degree"), ("zz", "not a layout name")):
        with pytest.raises(ValueError, match=message):
            parse_layout(bad, 2)


@pytest.mark.parametrize("world,batch", [(2, 4), (4, 12), (8, 24)])
def test_default_layouts_are_valid_for_the_small_preset(world, batch):
    args = argparse.Namespace(nproc=world, layout=None, microbatches=1, pipe_microbatches=4, global_batch=0,
                              preset="small", images=4, out="unused", warmup=1, steps=1)
    layouts, global_batch = plan_runs(args)
    assert [x.name for x in layouts] == default_layouts(world) and global_batch == batch
    assert {x.kind for x in layouts} == {"homogeneous", "colocated", "pipelined"}
    if world == 4:  # the LM's 2 KV heads cannot split 4 ways: refused before anything runs, naming the layout
        with pytest.raises(ValueError, match=r"--layout tp4: module 'language': kv_heads \(2\)"):
            plan_runs(argparse.Namespace(**{**vars(args), "layout": ["tp4"]}))


def test_failure_names_the_ranks_error_not_torchruns():
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad batch: rows\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\n")
    assert failure(text, 1) == "failed (rc=1): ValueError: bad batch: rows"
    assert failure("torch.OutOfMemoryError: CUDA out of memory.", 1) == "out of memory"


def test_profile_table_lists_every_rank_of_every_profiled_layout():
    split = {"span": 10.0, "compute": 6.0, "exposed_comm": 3.0, "idle": 1.0}
    text = profile_table([{"layout": "dp2", "profile": [split, split]}, {"layout": "tp2", "error": "out of memory"}])
    assert text.splitlines()[2:] == ["| dp2 | 0 | 10.0 | 6.0 | 3.0 | 1.0 |", "| dp2 | 1 | 10.0 | 6.0 | 3.0 | 1.0 |"]
