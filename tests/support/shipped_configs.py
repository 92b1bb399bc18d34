"""Every config in configs/ trained for 2 steps as a user runs it (`mimo train CONFIG [--nproc N]`), made small
enough for a CPU: the world size each layout needs, and tiny stand-ins for the checkpoints and data that the
recipes (llava_*, native_qwen2_5_vl, librispeech_asr) expect the user to download."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mimo.data.librispeech import main as write_manifest
from tests.support.audio_data import TINY_AUDIO, write_librispeech
from tests.support.cli_curve import loss_curve
from tests.support.configs import CONFIGS
from tests.support.hf_helpers import llava_parts, tiny_tokenizer
from tests.support.llava_pretrain import make_llava_pretrain
from tests.support.native_data import TINY as TINY_NATIVE
from tests.support.native_data import manifest

SHIPPED = sorted(p.name for p in CONFIGS.glob("*.toml"))
WORLD = {"demo_tp2_dp2.toml": 4, "demo_cp2_tp2.toml": 4, "demo_colocated_fanin.toml": 8,
         "demo_colocated_fanout.toml": 8, "demo_pipeline.toml": 8, "demo_colocated_pipeline.toml": 4}
"""The ranks each layout config spans (`mimo train CONFIG --nproc N`); every other config runs on one process."""

TWO_STEPS = ["--train.steps=2", "--train.log_every=1", "--metrics.progress=false", "--metrics.tensorboard=false"]
ON_THE_CPU = ["--train.device=cpu", "--precision.dtype=float32"]  # the recipes ask for a GPU and bf16
TINY_LM = ["--model.llm.hidden=32", "--model.llm.layers=1", "--model.llm.heads=2", "--model.llm.kv_heads=1",
           "--model.llm.mlp=64"]


def _llava(tmp_path: Path, lm_family: str, tower: str) -> list[str]:
    _, _, checkpoints = llava_parts(tmp_path / "hf", lm_family, tower)
    tiny_tokenizer(tmp_path / "tokenizer")
    base = make_llava_pretrain(tmp_path / "data")
    return [*checkpoints, *ON_THE_CPU, f"--data.tokenizer={tmp_path / 'tokenizer'}", "--data.seq_len=64",
            "--data.global_batch=4", f"--data.path={base / 'blip_laion_cc_sbu_558k.json'}",
            f"--data.image_root={base / 'images'}"]


def _librispeech(tmp_path: Path) -> list[str]:
    write_manifest([str(write_librispeech(tmp_path)), str(tmp_path / "train.jsonl"), "--lowercase"])
    tower = ["--model.modalities.audio.audio.n_mels=16", "--model.modalities.audio.audio.hidden=32",
             "--model.modalities.audio.audio.layers=1", "--model.modalities.audio.audio.heads=2",
             "--model.modalities.audio.audio.mlp=64"]
    return [*TINY_LM, *tower, *TINY_AUDIO, *ON_THE_CPU, f"--data.path={tmp_path / 'train.jsonl'}",
            "--data.seq_len=48", "--data.global_batch=4", "--data.workers=0"]


def stand_ins(config: str, tmp_path: Path) -> list[str]:
    """The overrides that make `config` train small on this machine, after writing what they point at."""
    if config.startswith("llava_"):
        return _llava(tmp_path, *{"llava_llama_clip.toml": ("llama", "clip"),
                                  "llava_qwen2_siglip.toml": ("qwen2", "siglip")}[config])
    if config == "native_qwen2_5_vl.toml":
        return [*TINY_NATIVE, f"--data.path={manifest(tmp_path)}"]
    if config == "librispeech_asr.toml":
        pytest.importorskip("soundfile", reason="LibriSpeech's FLAC clips need the audio extra")
        return _librispeech(tmp_path)
    return []  # the demos make their own data


def train_two_steps(config: str, tmp_path: Path) -> list[float]:
    """`mimo train configs/<config>` for 2 steps on its world size; the loss of each step."""
    overrides = [*stand_ins(config, tmp_path), *TWO_STEPS]
    losses = loss_curve(tmp_path / "runs", "smoke", config, WORLD.get(config, 1), *overrides, timeout=600)
    summary = json.loads((tmp_path / "runs" / "smoke" / "summary.json").read_text())
    assert summary["steps"] == 2, summary
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    return losses
