"""The demo trained through the CLI on several processes has the single-process loss curve.

Each layout config keeps demo_vlm's model, seed and global batch, so per-step losses must agree to
float rounding (within 1e-4 relative over 20 steps): DP2 x TP2 with sequence parallel on 4 ranks,
the colocated fan-in and fan-out layouts on 8 ranks, the pipelined layout on 8 ranks (encoder
tp2 on ranks 0-1, LM tp2 x pp3 on ranks 2-7, 1F1B over 4 microbatches), context parallelism (LM
cp2 x tp2) on 4 ranks, sequence packing on one process, and the encoder dp4 beside the LM pp2 x dp2 on 4
ranks; `perf.fuse_qkv` under LM cp2 on 2 ranks and a pipelined layout on 3; `perf.activation_checkpointing`
under LM cp2 x tp2 on 4 ranks, the pipeline on 3 and the encoder beside the LM pp2 on 4.
"""

import subprocess
from pathlib import Path

import pytest

from mimo.parallel.runtime import torchrun_cmd
from tests.support.cli_curve import ROOT, STEPS, failure_output, loss_curve


def _train(tmp: Path, config: str, nproc: int) -> list[float]:
    return loss_curve(tmp, f"{Path(config).stem}_{nproc}", config, nproc)


def _assert_follows(losses: list[float], reference: list[float]) -> None:
    """All 20 steps within 1e-4 relative of the single-process curve."""
    assert len(losses) == len(reference) == 20
    for step, (a, b) in enumerate(zip(losses, reference)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: {a} vs single-process {b}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[float]:
    return _train(tmp_path_factory.mktemp("ref"), "demo_vlm.toml", 1)


@pytest.mark.parametrize("config,nproc", [("demo_tp2_dp2.toml", 4), ("demo_colocated_fanin.toml", 8),
                                          ("demo_colocated_fanout.toml", 8), ("demo_pipeline.toml", 8),
                                          ("demo_cp2_tp2.toml", 4), ("demo_packed.toml", 1),
                                          ("demo_colocated_pipeline.toml", 4)])
def test_layouts_reproduce_the_single_process_loss_curve(reference, tmp_path, config, nproc):
    _assert_follows(_train(tmp_path, config, nproc), reference)


PIPELINE_3 = ["--parallel.modules.images.size=1", "--parallel.modules.images.tp=1",
              "--parallel.modules.language.offset=1", "--parallel.modules.language.size=2",
              "--parallel.modules.language.tp=1", "--parallel.modules.language.pp=2"]
"""demo_pipeline on 3 ranks: the encoder on rank 0, the LM pp2 on ranks 1-2."""


@pytest.mark.parametrize("config,nproc,overrides", [
    ("demo_vlm.toml", 2, ["--parallel.modules.language.cp=2"]),
    ("demo_pipeline.toml", 3, PIPELINE_3),
])
def test_fused_qkv_reproduces_the_single_process_loss_curve(reference, tmp_path, config, nproc, overrides):
    """`perf.fuse_qkv` under context parallelism (LM cp2) and the pipeline: one product for q, k and v
    changes no loss beyond float rounding."""
    _assert_follows(loss_curve(tmp_path, f"fused_{nproc}", config, nproc, "--perf.fuse_qkv=true", *overrides),
                    reference)


@pytest.mark.parametrize("config,nproc,overrides", [("demo_cp2_tp2.toml", 4, []),
                                                    ("demo_pipeline.toml", 3, PIPELINE_3),
                                                    ("demo_colocated_pipeline.toml", 4, [])])
def test_activation_checkpointing_reproduces_the_single_process_loss_curve(reference, tmp_path, config, nproc,
                                                                           overrides):
    """`perf.activation_checkpointing` of both modules under LM cp2 x tp2 with sequence parallel and the
    encoder tp2 (the recompute repeats their collectives in the backward), under the pipeline, and beside the
    colocated pipeline (the encoder recomputed at its backward, after the LM's pipeline)."""
    ckpt = '--perf.activation_checkpointing=["language", "images"]'
    _assert_follows(loss_curve(tmp_path, f"ckpt_{nproc}", config, nproc, ckpt, *overrides), reference)


def test_train_leaves_the_process_group_before_the_interpreter_exits(tmp_path):
    """`mimo train` under torchrun destroys its process groups itself once the run is done: left to
    interpreter shutdown, gloo's threads can free Python-held tensors too late and abort a finished rank."""
    script = tmp_path / "train_then_report.py"
    script.write_text("import sys\nimport torch.distributed as dist\nfrom mimo.cli import main\n"
                      "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
                      "    print(f'exit={e.code} joined={dist.is_initialized()}')\n")
    cmd = [*torchrun_cmd(2), str(script), "train", str(ROOT / "configs" / "demo_vlm.toml"),
           "--parallel.modules.language.cp=2", f"--run.out_dir={tmp_path}", "--run.name=leave", *STEPS[1:],
           "--train.steps=2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, failure_output(r.stderr)
    assert r.stdout.count("exit=0 joined=False") == 2, r.stdout[-2000:]
