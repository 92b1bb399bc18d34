"""Through the trainer, the tiny demo packed (one process, and LM cp2 x tp2 with sequence parallel on 4
ranks, every step's module times stamped for summary.json's time_share) has the unpacked run's per-step losses,
with less padding."""

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.tiny_run import metrics, tiny_config, train_rank

LAYOUT = ["--model.llm.kv_heads=2", "--train.steps=3", "--data.global_batch=8"]
PACKED = ["--data.packing=true", "--data.pack_length=48"]
CP_TP = ["--parallel.modules.language.cp=2", "--parallel.modules.language.tp=2",
         "--parallel.modules.language.sequence_parallel=true", "--parallel.modules.images.tp=2"]


def test_trainer_packed_and_context_parallel_reproduce_the_unpacked_losses(tmp_path):
    runs = {}
    for name, overrides in (("padded", []), ("packed", PACKED)):
        out = tmp_path / name
        summary = Trainer(tiny_config(out, *LAYOUT, *overrides)).train()
        runs[name] = [m["loss"] for m in metrics(out)]
    assert summary["padding"]["padding_after"] < summary["padding"]["padding_before"]
    out = tmp_path / "cp2_tp2_packed"
    timed = ["--metrics.time_share_every=1", "--metrics.throughput_warmup=0"]  # stamping changes no number
    shares = run_distributed(train_rank, 4, str(out), [*LAYOUT, *PACKED, *CP_TP, *timed], timeout=300)[0]["time_share"]
    assert shares.keys() == {"images", "language"} and abs(sum(shares.values()) - 1) < 1e-3
    runs["cp2_tp2_packed"] = [m["loss"] for m in metrics(out)]
    ref = runs["padded"]
    assert len(ref) == 3
    for name, losses in runs.items():
        assert len(losses) == len(ref), name
        for step, (a, b) in enumerate(zip(losses, ref)):
            assert abs(a - b) <= 1e-5 * abs(b), f"{name} step {step}: {a} vs padded {b}"
