"""A Trainer leaves the process group it joined (at the end of `train()`, or of a `with` block), and leaves a
group its caller joined alone. One process: a world of one rank is a real gloo group."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

import mimo.parallel.runtime as runtime
from mimo import Trainer
from tests.support.tiny_run import tiny_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun_env(monkeypatch):
    """The environment torchrun gives rank 0 of a world of one, with the runtime told it was launched."""
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(runtime, "launched_distributed", lambda: True)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_train_leaves_the_group_it_joined(tmp_path, torchrun_env):
    trainer = Trainer(tiny_config(tmp_path, "--train.steps=2"))
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert trainer.train()["steps"] == 2
    assert not dist.is_initialized()


def test_a_with_block_leaves_the_group_it_joined(tmp_path, torchrun_env):
    with Trainer(tiny_config(tmp_path, "--train.steps=2")) as trainer:
        assert dist.is_initialized()
        trainer.train_step(0)
    assert not dist.is_initialized()


def test_a_group_the_caller_joined_stays(tmp_path, torchrun_env):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with Trainer(tiny_config(tmp_path, "--train.steps=2")) as trainer:
        trainer.train_step(0)
    assert dist.is_initialized()
    assert Trainer(tiny_config(tmp_path, "--train.steps=2", "--run.overwrite=true")).train()["steps"] == 2
    assert dist.is_initialized()
