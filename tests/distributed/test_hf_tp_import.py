"""Importing a Hugging Face LM under TP=2 (each rank reading only its shard) gives the TP=1 logits."""

import pytest
import torch
import torch.distributed as dist

from mimo.hf.config import llm_config_from_hf
from mimo.hf.files import open_source
from mimo.hf.load import dim_shard_fn, import_llm, load_llm_weights
from mimo.models.llm import DecoderLM
from mimo.parallel.tensor import parallelize_lm, tp_lm_logits, tp_shard_dim
from tests.support.dist import run_distributed
from tests.support.hf_helpers import TOL, rel_diff, save, tiny_text_config, transformers

pytestmark = pytest.mark.usefixtures("one_thread")


def _tp_import(rank: int, world: int, directory: str) -> None:
    torch.manual_seed(3)
    ids = torch.randint(0, 96, (2, 9))
    pos = torch.arange(9).expand(2, 9)
    full = import_llm(directory)
    ref = full.logits(full(full.embed(ids), pos))
    group = dist.new_group(list(range(world)))
    with open_source(directory) as src:
        lm = DecoderLM(llm_config_from_hf(src.config()))
        parallelize_lm(lm, group, sequence_parallel=False)
        dims = {name: tp_shard_dim(_owner(lm, name), name) for name, _ in lm.named_parameters()}
        shard = dim_shard_fn(dims.get, rank, world)
        read: list[str] = []

        def recording(name, sl):
            read.append(name)
            return shard(name, sl)

        load_llm_weights(lm, src, recording)
    # load_llm_weights refuses a tensor whose shape is not its parameter's (this rank's shard), so a
    # complete load read only shards; some of them must really be cut
    assert any(dims[n] is not None for n in read)
    got = tp_lm_logits(group, False)(lm(lm.embed(ids), pos), lm)
    assert rel_diff(got, ref) <= TOL, rel_diff(got, ref)


def _owner(module: torch.nn.Module, name: str) -> torch.nn.Module:
    return module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module


def test_tp2_import_matches_tp1(tmp_path):
    cfg = tiny_text_config("qwen2", vocab_size=96)
    torch.manual_seed(0)
    directory = save(transformers.Qwen2ForCausalLM(cfg).eval(), tmp_path / "qwen2")
    run_distributed(_tp_import, 2, str(directory), timeout=180)
