"""bench_native_attention on the CPU: the grouped reference path gives a row per kind of layer (windows, frames) over
Qwen2.5-VL-sized images, and the CUDA-only kernel a row naming why it did not run."""

import pytest

from benchmarks.bench_native_attention import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rows_for_windows_and_frames(capsys):
    rows = main(["--device", "cpu", "--images", "2", "--sides", "224", "280", "--iters", "1", "--warmup", "0"])
    grouped = [r for r in rows if r["kernel"] == "grouped"]
    assert [r["layer"] for r in grouped] == ["windows", "frames"]
    assert grouped[0]["patches"] == grouped[1]["patches"] and grouped[0]["segments"] > grouped[1]["segments"] == 2
    assert all(r["out_err"] == r["grad_err"] == 0 for r in grouped)
    assert all("error" in r for r in rows if r["kernel"] == "varlen")  # flash attention runs on CUDA only
    assert "| windows | grouped |" in capsys.readouterr().out
