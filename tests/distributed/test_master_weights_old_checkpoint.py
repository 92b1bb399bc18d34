"""A `precision.master_weights` checkpoint written while MasterAdamW kept one update count for all its parameters
(one scalar "step" per part and rank, up to commit OLD) resumes under today's per-parameter counts: every count
takes that scalar, and the run goes on bit for bit as the old code's own run does. The oracle is the old code
itself, taken out of git into a temporary folder: it trains 6 steps saving every 2, and today's code resumes its
step-4 checkpoint; the losses of steps 4-5 and every tensor of the step-6 checkpoints (bf16 weights, fp32 master
weights and moments) are equal, and each per-parameter count is the old scalar. On 1 rank and on 2 (ZeRO-1: each
rank's own shards and scalar).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from mimo.train.checkpoint.safe_dcp import SafeFileSystemReader, read_metadata_file
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.master_weights import MASTER_SAVES, STEP4
from tests.support.tiny_run import metrics, tiny_config

OLD = "aeb210f"  # the last MasterAdamW with one scalar step count
STEP6 = STEP4.parent / "step_00000006"
# run the old tree's tiny run, refusing to run if another mimo is imported
OLD_RUN = ("import sys, mimo; from pathlib import Path; "
           "assert Path(mimo.__file__).is_relative_to(Path.cwd()), mimo.__file__; "
           "from tests.support.dist import run_distributed; from tests.support.tiny_run import train_rank; "
           "run_distributed(train_rank, int(sys.argv[1]), sys.argv[2], sys.argv[3:], timeout=300)")


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory) -> Path:
    """Commit OLD's mimo, configs and test support, extracted from this checkout's git history."""
    root = Path(__file__).resolve().parents[2]
    tree = tmp_path_factory.mktemp("old_mimo")
    got = subprocess.run(["git", "-C", str(root), "archive", OLD, "mimo", "configs", "tests/__init__.py",
                          "tests/support"], capture_output=True, timeout=60)
    if got.returncode != 0:
        pytest.skip(f"commit {OLD}, whose code writes the old checkpoints, is not in this checkout: "
                    f"{got.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(got.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint folder, whole."""
    saved = read_metadata_file(path / ".metadata").state_dict_metadata
    out = {k: torch.empty(tuple(md.size), dtype=md.properties.dtype) for k, md in saved.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(out, storage_reader=SafeFileSystemReader(str(path)), no_dist=True)
    return out


def _resume_rank(rank: int, world: int, out: str, resume: str) -> list[list[float]]:
    """Resume `resume` and train to the end with today's code; every part's per-parameter counts."""
    trainer = Trainer(tiny_config(Path(out), *MASTER_SAVES, f"--checkpoint.resume={resume}"))
    trainer.train()
    return [opt.steps.tolist() for _, opt in trainer.optimizer.parts]


@pytest.mark.parametrize("world", [1, 2], ids=["one", "dp2"])
def test_an_old_scalar_step_checkpoint_resumes_as_the_old_code_goes_on(old_tree, tmp_path, world):
    old, new = tmp_path / "old", tmp_path / "new"
    subprocess.run([sys.executable, "-c", OLD_RUN, str(world), str(old), *MASTER_SAVES], cwd=old_tree,
                   env={**os.environ, "PYTHONPATH": str(old_tree)}, check=True, timeout=400)
    counts = run_distributed(_resume_rank, world, str(new), str(old / STEP4), timeout=300)
    want, got = _checkpoint(old / STEP6), _checkpoint(new / STEP6)
    scalars = {k: v for k, v in want.items() if k.startswith("master.") and k.endswith(".step")}
    assert len(scalars) == world * len(counts[0]) > 0 and all(v.shape == () for v in scalars.values())
    for rank_counts in counts:
        assert all(n == 6.0 for part in rank_counts for n in part), rank_counts  # loaded 4, then 2 steps
    assert want.keys() == got.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v.expand_as(got[k]) if k in scalars else v), k
    losses = [[(r["step"], r["loss"]) for r in metrics(run) if "loss" in r] for run in (old, new)]
    assert losses[1] == losses[0][4:] and [s for s, _ in losses[1]] == [4, 5]
