"""The audio-visual demo: batches mix samples with an image, a clip or both, train without bias on any
microbatch split (also one with no clip or no image at all), and `mimo train configs/demo_avlm.toml` runs."""

from pathlib import Path

import pytest
import torch

from mimo.config import load_config
from mimo.data.audio_demo import AVLMData
from mimo.data.batching import split_microbatches
from mimo.mimo_model import build_model
from mimo.train.trainer import Trainer

AVLM = Path(__file__).resolve().parents[1] / "configs" / "demo_avlm.toml"
TINY = ["--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=1",
        "--model.llm.mlp=64", "--model.modalities.images.vit.patch=16", "--model.modalities.images.vit.hidden=16",
        "--model.modalities.images.vit.layers=1", "--model.modalities.images.vit.heads=2",
        "--model.modalities.images.vit.mlp=32", "--model.modalities.audio.audio.n_mels=16",
        "--model.modalities.audio.audio.hidden=16", "--model.modalities.audio.audio.layers=1",
        "--model.modalities.audio.audio.heads=2", "--model.modalities.audio.audio.mlp=32",
        "--data.train_samples=16", "--data.eval_samples=8", "--data.global_batch=8", "--optim.warmup_steps=1",
        "--run.progress=false", "--run.tensorboard=false", "--train.threads=1"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a busy machine's other processes keep their cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny():
    cfg = load_config(AVLM, TINY)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    data = AVLMData(16, 8, seed=1, image_tokens=4, image_token_id=259, audio_token_id=260, n_mels=16)
    return model, data


def test_batches_mix_modalities_and_count_their_tokens():
    _, data = tiny()
    b = data.collate(data.train[:8])
    has_img = [s.image is not None for s in data.train[:8]]
    has_aud = [s.audio is not None for s in data.train[:8]]
    assert b["modality_counts"]["images"].tolist() == [int(x) for x in has_img]
    assert b["modality_counts"]["audio"].tolist() == [int(x) for x in has_aud]
    assert not all(has_img) and not all(has_aud)
    lengths = b["modality_inputs"]["audio"]["whisper"]["output_lengths"]
    assert (b["input_ids"] == 259).sum() == 4 * sum(has_img)
    assert (b["input_ids"] == 260).sum() == lengths.sum()
    assert len(set(lengths.tolist())) > 1, "clips of different durations"
    assert b["modality_inputs"]["images"]["vit"]["pixel_values"].shape[0] == sum(has_img)
    assert {s.about for s in data.train} == {"image", "audio"}


def _grads(model, micro: list[dict]) -> dict[str, torch.Tensor]:
    model.zero_grad()
    n = sum((mb["labels"] != -100).sum() for mb in micro).float()
    for mb in micro:
        (model(**mb).loss_sum / n).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def test_any_microbatch_split_gives_the_whole_batch_gradients():
    model, data = tiny()
    by_layout = {}
    for s in data.train:
        by_layout.setdefault((s.image is not None, s.audio is not None), []).append(s)
    # microbatches of 2 (k=4): [image, image] has no clip, [audio, audio] no image, then two mixed pairs
    order = (by_layout[(True, False)][:2] + by_layout[(False, True)][:2] + by_layout[(True, True)][:2]
             + [by_layout[(True, False)][2], by_layout[(False, True)][2]])
    batch = data.collate(order)
    whole = _grads(model, split_microbatches(batch, 1))
    for k in (2, 4, 8):
        split = _grads(model, split_microbatches(batch, k))
        assert split.keys() == whole.keys()
        for name in whole:
            torch.testing.assert_close(split[name], whole[name], rtol=1e-5, atol=1e-7)
    assert whole["modality_submodules.audio.encoders.whisper.conv1.weight"].abs().sum() > 0
    assert whole["modality_submodules.images.encoders.vit.patch_embedding.weight"].abs().sum() > 0


def test_demo_config_trains_and_evaluates(tmp_path):
    cfg = load_config(AVLM, [*TINY, "--train.steps=3", f"--run.out_dir={tmp_path}", "--parallel.microbatches=2"])
    summary = Trainer(cfg).train()
    ev = summary["eval"]
    assert ev["eval_samples"] == 8 and 0 <= ev["image_accuracy"] <= 1 and 0 <= ev["audio_accuracy"] <= 1
    assert set(ev["majority_baseline"]) == {"image", "audio"}
    assert (tmp_path / "demo_avlm" / "checkpoint" / "model.safetensors").is_file()
