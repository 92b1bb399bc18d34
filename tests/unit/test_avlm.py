"""The audio-visual demo: batches mix samples with an image, a clip or both, train without bias on any
microbatch split (also one with no clip or no image at all), and `mimo train configs/demo_avlm.toml` runs."""

from collections import Counter

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.data.audio_demo import AVLMData
from mimo.data.batching import split_microbatches
from mimo.models.build import build_model
from mimo.models.step_hints import forward_args
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.train.trainer import Trainer
from tests.support.configs import AVLM
from tests.support.configs import TINY_AVLM as TINY

pytestmark = pytest.mark.usefixtures("one_thread")

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
        (model(**forward_args(mb)).loss_sum / n).backward()
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
    trainer = Trainer(cfg)
    ev = trainer.train()["eval"]
    held_out = trainer.data.eval
    assert ev["eval_samples"] == len(held_out) == 8
    # every held-out question is scored, and the per-question scores add up to the image and audio ones
    asked = Counter(s.question for s in held_out)
    assert set(ev["per_question"]) == set(asked)
    for about in ("image", "audio"):
        questions = {s.question for s in held_out if s.about == about}
        n = sum(asked[q] for q in questions)
        assert ev[f"{about}_accuracy"] == pytest.approx(sum(ev["per_question"][q] * asked[q] for q in questions) / n)
    assert set(ev["majority_baseline"]) == {"image", "audio"}
    assert any((tmp_path / "demo_avlm" / "checkpoints").glob("step_*/COMPLETE.json"))


def test_tensor_parallel_audio_encoder_is_refused_by_name():
    """Only ViT encoders have a tensor-parallel plan; an audio encoder with tp > 1 is a config error, not a
    KeyError deep inside the plan (and not a check of the unused ViT settings)."""
    cfg = load_config(AVLM, ["--parallel.modules.audio.tp=2"])
    layout = Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2)
    with pytest.raises(ConfigError, match=r"parallel.modules.audio.tp = 2: tensor parallelism splits ViT encoders "
                                          r"only, and 'audio' is not a vision modality \(kind = 'audio'\)"):
        validate_plan(cfg, layout)
    cfg = load_config(AVLM, ["--parallel.modules.images.tp=2"])
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))
