"""Fixtures shared by test files, and the two test tiers.

`make test` runs every test outside tests/distributed/ plus the CORE tests below, one per family of multi-process
tests; `make test-all` runs everything. Every test under tests/distributed/ is marked `distributed`, the CORE ones
also `core`, so `make test` is `pytest -m "not distributed or core"`.
"""

import pytest
import torch

D = "tests/distributed/"
CORE = {  # family -> the test that stands for it in `make test`
    "colocated bridge (fan-in, fan-out, equal)": D + "test_bridge.py::test_bridge_moves_and_backward_on_8_ranks",
    "colocated layouts train like one process": D + "test_colocated.py::"
                                                    "test_colocated_fan_in_and_fan_out_equal_single_process[2]",
    "pipeline (1F1B) and its bridge": D + "test_pipeline.py::test_pipelined_layouts_equal_single_process[4]",
    "colocated encoders beside a pipelined LM": D + "test_colocated_pipeline.py::"
                                                   "test_colocated_pipeline_equals_single_process[4]",
    "interleaved pipeline": D + "test_interleaved_ranks.py::test_interleaved_1f1b_trains_like_single_process[3]",
    "context parallel": D + "test_context_parallel.py::test_context_parallel_equals_single_process[2]",
    "tensor + sequence parallel": D + "test_tensor_parallel.py::test_tensor_parallel_matches_single_process[2]",
    "data parallel and FSDP": D + "test_data_parallel.py::test_data_parallel_matches_single_process_2_ranks",
    "expert parallel": D + "test_expert_parallel.py::test_expert_parallel_equals_single_process",
    "checkpoint resume into another layout": D + "test_checkpoint_reshard.py::"
                                                 "test_dp2_checkpoint_loads_into_tp2_and_into_one_process",
    "packing": D + "test_packing_ranks.py::test_trainer_packed_and_context_parallel_reproduce_the_unpacked_losses",
    "launcher (mimo train --nproc)": D + "test_launcher.py::test_a_failing_rank_is_reported_once_without_tracebacks",
    "a shipped config through mimo train": D + "test_shipped_configs.py::"
                                               "test_shipped_config_trains_2_steps[demo_vlm.toml]",
}


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and a busy machine's other processes keep their cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """Mark the tests under tests/distributed/ `distributed` and the CORE ones `core`; when the `core` tier is
    selected, refuse a CORE entry that names no collected test (a renamed test must not drop out silently)."""
    core = set(CORE.values())
    for item in items:
        if item.nodeid.startswith("tests/distributed/"):
            item.add_marker(pytest.mark.distributed)
            if item.nodeid in core:
                item.add_marker(pytest.mark.core)
    missing = core - {item.nodeid for item in items}
    if "core" in (config.getoption("markexpr") or "") and missing:
        raise pytest.UsageError(f"tests/conftest.py CORE names tests that do not exist: {sorted(missing)}")
