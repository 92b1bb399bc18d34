"""Fixtures shared by test files."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and a busy machine's other processes keep their cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
