"""benchmarks/bench_planner and its configs on the CPU: each config's progress on stderr as it runs, a config past
--timeout killed into an error row, and the images-and-audio config resolving to the eager step it documents."""

import json
import time

from benchmarks.bench_planner import main
from mimo.config.load import load_config
from mimo.perf.gpu_defaults import resolve_gpu_defaults
from mimo.planner.profile import shipped_profile

TINY = "configs/demo_avlm.toml::data.global_batch=4,data.eval_samples=2"


def rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_config_prints_its_progress_then_its_row(tmp_path, capsys):
    profile = tmp_path / "cpu.json"
    shipped_profile("cpu").save(profile)
    main(["--profile", str(profile), "--config", TINY, "--steps", "1", "--warmup", "1", "--timeout", "300"])
    out, err = capsys.readouterr()
    (row,) = rows(out)
    assert row["config"] == TINY and "error" not in row, row
    assert row["step_s"] > 0 and row["predicted_step_s"] > 0
    lines = [line for line in err.splitlines() if line.startswith("bench_planner: ")]
    assert lines[0] == f"bench_planner: config 1 of 1: {TINY}"
    assert "Trainer built in" in lines[1] and "step 0 took" in lines[2] and "step 1 took" in lines[3]
    assert "measured in" in lines[4]


def test_a_config_past_the_timeout_is_killed_into_an_error_row(tmp_path, capsys):
    profile = tmp_path / "cpu.json"
    shipped_profile("cpu").save(profile)
    began = time.perf_counter()
    main(["--profile", str(profile), "--config", TINY, "--config", TINY, "--timeout", "0.5"])
    assert time.perf_counter() - began < 30
    first, second = rows(capsys.readouterr().out)
    for row in first, second:
        assert row["config"] == TINY and row["error"].startswith("timed out after 0.5 s (--timeout)")
        assert "step_s" not in row


def test_the_images_and_audio_config_stays_eager_under_the_gpu_defaults():
    """Its image and clip counts vary from batch to batch: compiled, its encoders and the LM's layers would
    recompile on the first steps (the GPU call that gave no row), so the file turns compile off itself."""
    cfg = load_config("benchmarks/planner/avlm_h200.toml", [])
    run, notes = resolve_gpu_defaults(cfg, None)
    assert cfg.train.device == "cuda" and ("perf.compile", False, "set in the config") in notes
    assert run.perf.compile is False
    assert cfg.data.global_batch == 128
