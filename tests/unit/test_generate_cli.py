"""`mimo generate` with --audio, --prompts files and warnings for a question about an input it lacks. The
oracle is the audio demo's own training layout (AVLMData.prompt_ids and modality_inputs) fed to
greedy_generate directly."""

from __future__ import annotations

import json
import wave

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.cli import main
from mimo.config.load import dump_toml, load_config
from mimo.data.audio_demo import AVSample, build_avlm_data, synth_tones
from mimo.data.audio_files import decode_audio
from mimo.hf.build import build_model
from mimo.models.audio_features import WHISPER_SAMPLING_RATE
from mimo.models.generate import greedy_generate, left_pad
from mimo.train.checkpoint.weights import save_weights
from tests.support.configs import AVLM, TINY_AVLM
from tests.support.hf_helpers import perturb

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 6


def write_wav(path, samples: np.ndarray, rate: int = WHISPER_SAMPLING_RATE, channels: int = 1) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


@pytest.fixture(scope="module")
def avlm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("avlm")
    cfg = load_config(AVLM, TINY_AVLM)
    torch.manual_seed(0)
    model = perturb(build_model(cfg.model), scale=0.3).eval()
    run = tmp / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(cfg))
    save_weights(model, run)
    clip = synth_tones("high", 2, "rising", np.random.default_rng(0))
    write_wav(tmp / "beeps.wav", clip)
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(tmp / "img.png")
    return cfg, model, run, tmp


def generate(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["generate", "--max-new-tokens", str(STEPS), *map(str, args)])
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def expected(cfg, model, samples: list[AVSample]) -> str:
    """What the training layout of these samples decodes to, one line per sample."""
    data = build_avlm_data(cfg, model)
    ids, mask = left_pad([data.prompt_ids(s) for s in samples], data.tok.PAD)
    inputs, _ = data.modality_inputs(samples)
    inputs = {k: v for k, v in inputs.items() if any(t.shape[0] for t in v[next(iter(v))].values())}
    outs = greedy_generate(model, ids, inputs or None, STEPS, data.tok.EOS, attention_mask=mask)
    return "".join(data.tok.decode(o) + "\n" for o in outs)


def test_generate_audio_decodes_as_the_training_layout(avlm_run, capsys):
    cfg, model, run, tmp = avlm_run
    code, out, err = generate(capsys, "--run", run, "--audio", tmp / "beeps.wav", "--prompt", "high or low?")
    assert code == 0 and "warning" not in err
    clip = decode_audio(tmp / "beeps.wav")
    assert out == expected(cfg, model, [AVSample(None, clip, "high or low?", "", "audio")])


def test_a_prompt_file_mixes_images_clips_and_neither(avlm_run, capsys):
    cfg, model, run, tmp = avlm_run
    rows = [{"prompt": "high or low?", "audio": "beeps.wav"}, {"prompt": "what color?", "image": "img.png"},
            {"prompt": "number of beeps?", "image": "img.png", "audio": "beeps.wav"}]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = generate(capsys, "--run", run, "--prompts", tmp / "prompts.jsonl")
    assert code == 0 and "warning" not in err
    clip = decode_audio(tmp / "beeps.wav")
    side = cfg.model.modalities["images"].vit.image
    image = np.asarray(Image.open(tmp / "img.png").convert("RGB").resize((side, side), Image.BICUBIC))
    samples = [AVSample(None, clip, "high or low?", "", "audio"), AVSample(image, None, "what color?", "", "image"),
               AVSample(image, clip, "number of beeps?", "", "audio")]
    assert out == expected(cfg, model, samples)


def test_a_question_without_its_input_warns(avlm_run, capsys):
    _, _, run, tmp = avlm_run
    (tmp / "prompts.txt").write_text("high or low?\n\nwhat color?\n")
    code, out, err = generate(capsys, "--run", run, "--prompts", tmp / "prompts.txt")
    assert code == 0 and len(out.splitlines()) >= 2
    assert "'high or low?' asks about a sound but has none; give it with --audio" in err
    assert "'what color?' asks about an image but has none; give it with --image" in err


def test_generate_refusals(avlm_run, capsys, tmp_path):
    _, _, run, tmp = avlm_run
    code, _, err = generate(capsys, "--run", run, "--prompt", "a", "--prompt", "b", "--prompt", "c",
                            "--audio", tmp / "beeps.wav", "--audio", tmp / "beeps.wav")
    assert code == 2 and "give one --audio for every prompt, or one for all; got 2 for 3 prompts" in err
    code, _, err = generate(capsys, "--run", run)
    assert code == 2 and "--prompt TEXT" in err and "--prompts FILE" in err
    (tmp_path / "bad.wav").write_bytes(b"RIFF....not audio")
    code, _, err = generate(capsys, "--run", run, "--prompt", "high or low?", "--audio", tmp_path / "bad.wav")
    assert code == 2 and "mimo: error: --audio: audio '" in err and "bad.wav' cannot be decoded" in err


def test_decode_audio_mixes_channels_and_resamples(tmp_path):
    t = np.arange(8000) / 8000
    tone = 0.5 * np.sin(2 * np.pi * 200 * t)
    write_wav(tmp_path / "stereo8k.wav", np.stack([tone, tone], 1).reshape(-1), rate=8000, channels=2)
    clip = decode_audio(tmp_path / "stereo8k.wav")
    assert clip.dtype == np.float32 and clip.shape == (16000,)
    reference = 0.5 * np.sin(2 * np.pi * 200 * np.arange(16000) / 16000)
    assert np.abs(clip[:15990] - reference[:15990]).max() < 2e-3


def test_out_refuses_inputs_it_would_drop(avlm_run, capsys, tmp_path):
    """--out draws from one text prompt in one pass: an image, a clip (flags or JSONL), several prompts or
    --max-new-tokens are refused before the run loads (a missing --run folder is never read)."""
    _, _, _, tmp = avlm_run
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "a red square", "image": str(tmp / "img.png")}) + "\n")
    cases = [(["--prompt", "a red square", "--image", tmp / "img.png"], "drop --image"),
             (["--prompt", "a red square", "--audio", tmp / "beeps.wav"], "drop --audio"),
             (["--prompts", tmp_path / "p.jsonl"], "drop --image (or the JSONL line's \"image\"/\"audio\")"),
             (["--prompt", "a", "--prompt", "b"], "--out draws one prompt; got 2 prompts"),
             (["--prompt", "a red square", "--max-new-tokens", "8"], "drop --max-new-tokens")]
    for flags, message in cases:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["generate", "--run", str(tmp_path / "no_run"), "--out", str(tmp_path / "x.png"),
                  *map(str, flags)])
        err = capsys.readouterr().err
        assert done.value.code == 2 and message in err and "Traceback" not in err
        assert not (tmp_path / "x.png").exists()
