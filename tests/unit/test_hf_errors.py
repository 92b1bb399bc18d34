"""Import errors name the tensor and the file (missing file, wrong architecture, mismatched shapes), and
a tensor-parallel `shard_fn` reads exactly each rank's block."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mimo.hf import import_audio_encoder, import_llm, import_vision, load_hf_weights
from mimo.hf.load import dim_shard_fn
from mimo.hf.names import llm_names
from mimo.models.llm import DecoderLM
from tests.support.configs import tiny_llm
from tests.support.hf_helpers import (
    save,
    tiny_causal_lm,
    tiny_vision_config,
    transformers,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def qwen_dir(tmp_path):
    return save(tiny_causal_lm("qwen2"), tmp_path / "qwen2")


def test_missing_directory_and_config(tmp_path, qwen_dir):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        import_llm(tmp_path / "nowhere")
    (qwen_dir / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"qwen2/config.json"):
        import_llm(qwen_dir)


def test_missing_shard_names_tensor_and_file(tmp_path):
    directory = tmp_path / "sharded"
    tiny_causal_lm("llama").save_pretrained(directory, max_shard_size="20KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    lost = index["model.norm.weight"]
    (directory / lost).unlink()
    with pytest.raises(FileNotFoundError, match=rf"tensor '.*' should be in '.*{lost}'"):
        import_llm(directory)


def test_pickled_weights_are_refused(tmp_path, qwen_dir):
    for f in qwen_dir.glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    with pytest.raises(FileNotFoundError, match="pickled"):
        import_llm(qwen_dir)


def test_wrong_architecture_names_model_type_and_directory(tmp_path, qwen_dir):
    clip = save(transformers.CLIPVisionModel(tiny_vision_config("clip")), tmp_path / "clip")
    with pytest.raises(ValueError, match=r"model_type 'clip_vision_model'.*expected one of \['qwen2'"):
        import_llm(clip)
    with pytest.raises(ValueError, match=rf"{qwen_dir}.*model_type 'qwen2'"):
        import_vision(qwen_dir)
    with pytest.raises(ValueError, match="model_type 'qwen2'.*whisper"):
        import_audio_encoder(qwen_dir)


def test_mismatched_shape_names_tensor_and_file(qwen_dir):
    cfg = json.loads((qwen_dir / "config.json").read_text())
    cfg["intermediate_size"] = 40
    (qwen_dir / "config.json").write_text(json.dumps(cfg))
    expected = (r"tensor 'model.layers.0.mlp.gate_proj.weight' in '.*model.safetensors' has shape \(48, 32\), "
                r"but mimo's 'layers.0.mlp.gate_proj.weight' needs \(40, 32\)")
    with pytest.raises(ValueError, match=expected):
        import_llm(qwen_dir)


def test_missing_tensor_names_tensor_and_directory(qwen_dir):
    path = qwen_dir / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, path)
    with pytest.raises(ValueError, match=rf"tensor 'model.layers.1.self_attn.k_proj.bias' is not in .*{qwen_dir}"):
        import_llm(qwen_dir)


def column_or_row(name: str) -> int | None:
    """Megatron-style TP: q/k/v/gate/up split by output rows, o/down by input columns, the rest replicated."""
    if any(p in name for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
        return 0
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return 1
    return None


@pytest.mark.parametrize("from_object", [False, True])
def test_shard_fn_reads_each_ranks_block(from_object, qwen_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(qwen_dir)
    full = hf.state_dict()
    source = hf if from_object else qwen_dir
    for rank in range(2):
        # What a TP=2 rank holds: half the heads and half the MLP, same head size.
        shard = DecoderLM(tiny_llm(vocab=97, heads=2, kv_heads=1, mlp=24, head_dim=8))
        load_hf_weights(shard, source, llm_names(shard), dim_shard_fn(column_or_row, rank, 2))
        for name, t in shard.state_dict().items():
            ref = full["lm_head.weight" if name == "lm_head.weight" else "model." + name]
            dim = column_or_row(name)
            if dim is not None:
                ref = ref.chunk(2, dim=dim)[rank]
            assert torch.equal(t, ref), (rank, name)
