"""The layout benchmark on the CPU: its FLOPs formula for K images, its layout names, and a whole driver run
(three layouts on two gloo processes of preset tiny) that gives a finite row for each."""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.bench_layouts import default_layouts, parse_layout, plan_runs, profile_table
from benchmarks.launch import failure
from benchmarks.workload import baseline_module, images_seq_len

ROOT = Path(__file__).resolve().parents[2]


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


def test_driver_runs_three_layouts_on_two_cpu_processes(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.bench_layouts", "--nproc", "2", "--preset", "tiny", "--images", "2",
           "--layout", "dp", "--layout", "enc-dp_lm-tp", "--layout", "pipe", "--steps", "2", "--warmup", "1",
           "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "tiny_k2_n2.jsonl").read_text().splitlines()]
    assert [row["layout"] for row in rows] == ["dp", "enc-dp_lm-tp", "pipe"]
    for row in rows:
        assert "error" not in row, row
        for key in ("step_s_median", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        assert row["seq_len"] == 2 * 16 + 48 and row["global_batch"] == 4
        # same data and model on every layout (a smoke check only: random text keeps the loss near ln(vocab),
        # so layout bugs are the parity suites' job, tests/distributed/test_colocated.py and
        # tests/distributed/test_pipeline.py)
        assert row["final_loss"] == pytest.approx(rows[0]["final_loss"], rel=1e-3)
    assert (tmp_path / "tiny_k2_n2" / "pipe" / "config.toml").is_file()
    assert "| enc-dp_lm-tp | colocated |" in (tmp_path / "tiny_k2_n2.md").read_text()


def test_profile_table_lists_every_rank_of_every_profiled_layout():
    split = {"span": 10.0, "compute": 6.0, "exposed_comm": 3.0, "idle": 1.0}
    text = profile_table([{"layout": "dp2", "profile": [split, split]}, {"layout": "tp2", "error": "out of memory"}])
    assert text.splitlines()[2:] == ["| dp2 | 0 | 10.0 | 6.0 | 3.0 | 1.0 |", "| dp2 | 1 | 10.0 | 6.0 | 3.0 | 1.0 |"]


def test_profile_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --profile is allowed here")
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_layouts", "--profile", "--preset", "tiny"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--profile splits the GPUs' kernel timelines and needs CUDA" in r.stderr
