"""Fixtures shared by test files, and the two test tiers.

`make test` runs every test outside tests/distributed/ plus the CORE tests below, one per family of multi-process
tests; `make test-all` runs everything. Every test under tests/distributed/ is marked `distributed`, the CORE ones
also `core`, so `make test` is `pytest -m "not distributed or core"`.
"""

import pytest
import torch

CORE = {  # family -> the test that stands for it in `make test`
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
