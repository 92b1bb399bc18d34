"""train.threads = 0: a thread count from the usable cores, the node's processes and the load, never 0."""

from __future__ import annotations

import os

import pytest
import torch

from mimo.train import threads
from mimo.train.threads import MAX_AUTO_THREADS, auto_threads, set_threads


@pytest.mark.parametrize("cores, local, load, expected", [
    (2, 1, 0.0, 2),      # idle 2-core machine: both cores
    (2, 1, 0.9, 2),      # a fraction of a busy core leaves both
    (2, 1, 1.5, 1),      # one core busy
    (2, 1, 14.8, 1),     # far oversubscribed: still one thread
    (8, 4, 0.0, 2),      # four local processes share eight cores
    (8, 4, 5.0, 1),      # three cores free for four processes: one each
    (3, 4, 0.0, 1),      # more processes than cores
    (128, 1, 0.0, MAX_AUTO_THREADS),
])
def test_auto_threads_by_hand(cores, local, load, expected):
    assert auto_threads(cores, local, load) == expected


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_set_threads_uses_the_automatic_count_and_says_why(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    note = set_threads(0)
    assert torch.get_num_threads() == 1
    assert "1 CPU thread" in note and "load average 9.0" in note and "train.threads" in note
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert set_threads(0) is None and torch.get_num_threads() == 2


def test_an_explicit_count_or_omp_num_threads_wins(monkeypatch, restore_threads):
    monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    assert set_threads(2) is None and torch.get_num_threads() == 2
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert set_threads(0) is None and torch.get_num_threads() == 2
