"""A saved tiny LLaVA run and the `mimo` CLI called in-process on it, for export and generate tests."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.cli import main
from mimo.config.load import dump_toml
from mimo.config.schema import Config, DataConfig, ModalityConfig, ModelConfig, ViTConfig
from mimo.data.tokenizer import ByteTokenizer
from mimo.hf.build import build_model
from mimo.train.checkpoint.weights import save_weights
from tests.support.configs import tiny_llm
from tests.support.hf_helpers import perturb

PROMPTS = ["what color?", "a", "how many shapes are there?"]
STEPS = 10
TOWERS = {"clip": {}, "siglip_default": dict(class_token=False, pre_norm=False, patch_bias=True, act="gelu_tanh",
                                             drop_first_patch=True)}


def make_run(tmp_path, tower: str, vocab: int = ByteTokenizer.vocab_size, token_id: int = ByteTokenizer.IMAGE,
             tokenizer: str = "byte"):
    """A saved tiny LLaVA run (data.tokenizer = `tokenizer`, placeholder `token_id`) and three images of
    different sizes."""
    vit = ViTConfig(image=16, patch=4, hidden=16, heads=2, mlp=32, **TOWERS[tower])
    cfg = ModelConfig(llm=tiny_llm(vocab=vocab, init_std=0.2),
                      modalities={"images": ModalityConfig(token_id=token_id, vit=vit)})
    torch.manual_seed(0)
    model = perturb(build_model(cfg), scale=0.3)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(Config(model=cfg, data=DataConfig(tokenizer=str(tokenizer)))))
    save_weights(model, run)
    images = []
    for i, size in enumerate((16, 24, 13)):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
        images.append(path)
    return run, images


def cli(capsys, *args) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main([*map(str, args)])
    assert done.value.code == 0
    return capsys.readouterr().out


def mimo_generate(capsys, run, images=(), prompts=PROMPTS) -> str:
    """`mimo generate`'s answers as they are (its --jsonl "answer"s), one a line."""
    flags = [f for p in prompts for f in ("--prompt", p)] + [f for i in images for f in ("--image", i)]
    out = cli(capsys, "generate", "--run", run, "--max-new-tokens", STEPS, "--jsonl", *flags)
    return "".join(json.loads(line)["answer"] + "\n" for line in out.splitlines())
