"""`mimo train | generate | eval`: a thin layer over the library."""

from __future__ import annotations

import argparse
import json
import sys

from mimo.config import ConfigError, load_config

TRAIN_HELP = """Train a model described by a TOML config. Any config key can be overridden with a dotted
flag, e.g. `mimo train configs/demo_vlm.toml --train.steps=50 --model.llm.layers=4`.
Outputs go to runs/<run.name>/: config.toml, metrics.jsonl, tensorboard/, loss.png,
checkpoint/model.safetensors and summary.json."""


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.train.trainer import Trainer

    cfg = load_config(args.config, overrides)
    Trainer(cfg).train()
    return 0


def cmd_generate(args: argparse.Namespace, overrides: list[str]) -> int:
    import numpy as np
    import torch
    from PIL import Image

    from mimo.data.shapes import image_tensor_values
    from mimo.data.tokenizer import ByteTokenizer
    from mimo.generate import greedy_generate
    from mimo.train.checkpoint import load_run

    if overrides:
        raise ConfigError(f"generate takes no config overrides, got {overrides}")
    cfg, model = load_run(args.run)
    tok = ByteTokenizer()
    ids = [tok.BOS]
    modality_inputs = None
    if args.image:
        (name, mcfg), = cfg.model.modalities.items()
        vit = model.modality_submodules[name].encoders["vit"]
        img = Image.open(args.image).convert("RGB").resize((mcfg.vit.image, mcfg.vit.image))
        pixels = torch.from_numpy(image_tensor_values(np.asarray(img)))[None]
        ids += [mcfg.token_id] * vit.tokens_per_image
        modality_inputs = {name: {"vit": {"pixel_values": pixels}}}
    ids += tok.encode(args.prompt)
    out = greedy_generate(model, torch.tensor([ids]), modality_inputs, args.max_new_tokens, tok.EOS)
    print(tok.decode(out[0]))
    return 0


def cmd_eval(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.train.checkpoint import load_run
    from mimo.train.evaluate import evaluate_answers
    from mimo.train.trainer import build_demo_data

    if overrides:
        raise ConfigError(f"eval takes no config overrides, got {overrides}")
    cfg, model = load_run(args.run)
    print(json.dumps(evaluate_answers(model, build_demo_data(cfg, model)), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mimo", description="Train multimodal in/out models with a parallel "
                                "layout per module (encoders and LM each on their own TP/CP/PP/DP).")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train from a TOML config", description=TRAIN_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("config", help="path of a TOML config, e.g. configs/demo_vlm.toml")
    t.set_defaults(func=cmd_train)
    g = sub.add_parser("generate", help="greedy decoding from a trained run",
                       description="Answer a prompt about an image with a trained run (greedy, KV cache).")
    g.add_argument("--run", required=True, help="run folder written by `mimo train`, e.g. runs/demo_vlm")
    g.add_argument("--image", help="image file (any size; resized to the encoder's input)")
    g.add_argument("--prompt", required=True, help="text after the image, e.g. 'what color?'")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.set_defaults(func=cmd_generate)
    e = sub.add_parser("eval", help="held-out accuracy of a trained run",
                       description="Evaluate a trained run on its held-out set (exact match, greedy).")
    e.add_argument("--run", required=True, help="run folder written by `mimo train`")
    e.set_defaults(func=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        sys.exit(args.func(args, rest))
    except (ConfigError, FileNotFoundError) as e:
        print(f"mimo: error: {e}", file=sys.stderr)
        sys.exit(2)
