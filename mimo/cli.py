"""`mimo train | generate | eval | export | plan`: a thin layer over the library."""

from __future__ import annotations

import argparse
import json
import sys

from mimo.config.load import load_config
from mimo.config.schema import ConfigError

TRAIN_HELP = """Train a model described by a TOML config. Any config key can be overridden with a dotted
flag, e.g. `mimo train configs/demo_vlm.toml --train.steps=50 --model.llm.layers=4`.
Outputs go to runs/<run.name>/: config.toml (the config as it ran, GPU defaults resolved), metrics.jsonl,
tensorboard/, loss.png, checkpoints/step_*/ (the final weights: a sharded DCP checkpoint) and summary.json.
Every key is in docs/configuration.md; `mimo config KEY` prints one (its doc, type, default and values).

Several processes: `mimo train CONFIG --nproc 4` (local ranks started and watched by mimo), or
`torchrun --nproc-per-node 4 -m mimo train CONFIG`; the [parallel.modules.*] tables of the
config give each module its ranks and tp/cp/pp degrees (dp is what remains)."""


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.parallel.launch import die_with_launcher, launch_local, report_error

    die_with_launcher()  # first: the imports below take seconds
    from mimo.parallel.runtime import collective_failed, launched_distributed
    from mimo.train.faults import RunAborted
    from mimo.train.gate import validate_run
    from mimo.train.trainer import Trainer

    cfg = load_config(args.config, overrides)
    if args.nproc > 1 and not launched_distributed():
        validate_run(cfg, args.nproc)  # the ranks' own gate, once, before any starts
        return launch_local(args.nproc, ["train", args.config, *overrides])
    try:
        Trainer(cfg).train()
    except RunAborted as e:
        report_error(f"mimo: stopped: {e}")
        return 3
    except RuntimeError as e:
        if not collective_failed(e):
            raise
        report_error(f"mimo: error: a collective failed on this rank ({str(e).splitlines()[0]}): another rank "
                     "failed or stopped first, or the ranks disagree; a collective waits at most "
                     f"parallel.timeout_s = {cfg.parallel.timeout_s:g} s")
        return 1
    return 0


def cmd_config(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.config.reference import explain, reference_markdown

    if overrides or bool(args.key) == args.reference:
        raise ConfigError("give config keys (e.g. `mimo config perf.compile`) or --reference, one of them")
    print(reference_markdown() if args.reference else "\n".join(explain(key) for key in args.key), end="")
    return 0


def cmd_generate(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.data.prompts import answer_lines, check_out_request, generate_text, pair_inputs, read_prompt_file
    from mimo.eval.pictures import write_image
    from mimo.train.checkpoint.weights import load_run
    from mimo.train.threads import set_threads

    if overrides:
        raise ConfigError(f"generate takes no config overrides, got {overrides}")
    if bool(args.prompt) == bool(args.prompts):
        raise ConfigError("give the prompts with --prompt TEXT (repeat it for a batch) or --prompts FILE, one of them")
    texts, requests = read_prompt_file(args.prompts) if args.prompts else (args.prompt, [])
    if requests and (args.image or args.audio):
        raise ConfigError(f"--prompts '{args.prompts}' is JSONL: name each prompt's \"image\" and \"audio\" "
                          "there, not with --image/--audio")
    requests = requests or pair_inputs(texts, args.image or [], args.audio or [])
    if args.out:
        check_out_request(requests, args.max_new_tokens)
    cfg, model = load_run(args.run)
    set_threads(cfg.train.threads)
    if args.out:
        if not model.output_token_ids:
            raise ConfigError(f"--out writes an image, but the run '{args.run}' has no Out path; train one with "
                              "model.modalities.<m>.output_token_id set, e.g. configs/demo_text_to_image.toml")
        print(write_image(model, requests[0].text, args.out))
        return 0
    steps = DEFAULT_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens
    answers = generate_text(cfg, model, requests, steps, args.run)
    for line in answer_lines(requests, answers, args.jsonl):
        print(line)
    return 0


def cmd_eval(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.eval.pictures import write_showcase_grid
    from mimo.tasks import build_demo_data, evaluate_demo
    from mimo.train.checkpoint.weights import load_run
    from mimo.train.threads import set_threads

    if overrides:
        raise ConfigError(f"eval takes no config overrides, got {overrides}")
    cfg, model = load_run(args.run)
    set_threads(cfg.train.threads)
    if args.grid and cfg.data.name != "text_to_image":
        raise ConfigError(f"--grid draws the text-to-image showcase; the run '{args.run}' has data.name = "
                          f"'{cfg.data.name}', not 'text_to_image'")
    data = build_demo_data(cfg, model)
    print(json.dumps(evaluate_demo(cfg, model, data, "cpu"), indent=2))
    if args.grid:
        for prompt in write_showcase_grid(model, data, args.grid):
            print(prompt)
    return 0


def cmd_export(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.export.run import export_run

    if overrides:
        raise ConfigError(f"export takes no config overrides, got {overrides}")
    try:
        print(export_run(args.run, args.to, lm_only=args.lm_only, max_shard_bytes=parse_size(args.max_shard_size)))
    except (ValueError, FileExistsError, RuntimeError) as e:
        print(f"mimo: error: {e}", file=sys.stderr)
        return 2
    return 0


def parse_size(text: str) -> int:
    """`--max-shard-size`: bytes from "5GB", "500MB", "64KiB" or a plain number of bytes."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    number = t.rstrip("KMGIB")
    try:
        value = float(number) * units[t[len(number):]]
    except (ValueError, KeyError):
        raise ConfigError(f"--max-shard-size '{text}' is not a size; write e.g. 5GB, 500MB or 2GiB") from None
    if value < 1:
        raise ConfigError(f"--max-shard-size '{text}' must be at least one byte")
    return int(value)


PLAN_HELP = """Suggest parallel layouts for N GPUs, predict each one's step time and estimate its peak memory per
GPU, from the config's model (model.*), data, parallel.microbatches and train.* (dtype, fast paths,
activation checkpointing). Every row passes the same checks as `mimo train`; the layouts that fit are ranked
by predicted step time and the fastest is printed first as the [parallel...] tables to paste into the
config. Overrides work as for train, e.g.
`mimo plan configs/demo_vlm.toml --gpus 8 --model.llm.hidden=4096 --model.llm.layers=32`.
The time comes from a device profile (--profile; by default the shipped one of train.device: H200 for
cuda, a CPU's for cpu) and the link figures below; `mimo plan CONFIG --calibrate --out FILE` measures this
machine's device at the config's shapes and writes a profile. The models are estimates:
mimo/planner/predict.py and mimo/planner/memory.py state them."""


def cmd_plan(args: argparse.Namespace, overrides: list[str]) -> int:
    from mimo.planner.calibrate import write_profile
    from mimo.planner.candidates import make_plan
    from mimo.planner.network import Network
    from mimo.planner.profile import load_profile
    from mimo.planner.report import default_gpu_memory_gib, render, to_json

    cfg = load_config(args.config, overrides)
    if args.calibrate:
        print(write_profile(cfg, args.out))
        return 0
    network = Network(nvlink_gbps=args.nvlink_gbps, network_gbps=args.network_gbps, gpus_per_node=args.gpus_per_node)
    gpus = args.gpus if args.gpus is not None else (args.nodes or 0) * args.gpus_per_node
    if args.gpus is None and args.nodes is None:
        raise ConfigError("mimo plan needs --gpus N (or --nodes N with --gpus-per-node), e.g. --gpus 8")
    memory = args.gpu_memory_gib if args.gpu_memory_gib is not None else default_gpu_memory_gib()
    profile = load_profile(args.profile) if args.profile else None
    plan = make_plan(cfg, gpus, memory, profile, network, args.choose_microbatches)
    print(to_json(cfg, plan) if args.json else render(cfg, plan))
    return 0


DEFAULT_NEW_TOKENS = 32
"""`mimo generate`'s longest text answer when --max-new-tokens is not given."""

RUN_HELP = ("a run folder written by `mimo train` (its newest complete checkpoint) or one of its "
            "checkpoints/step_* folders, finished or not")


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    """`mimo plan` and its options."""
    pl = sub.add_parser("plan", help="suggest layouts and estimate memory per GPU for N GPUs", description=PLAN_HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pl.add_argument("config", help="path of a TOML config, e.g. configs/demo_vlm.toml")
    pl.add_argument("--gpus", type=int, default=None, help="number of GPUs to plan for, e.g. 8 (up to thousands)")
    pl.add_argument("--nodes", type=int, default=None, help="instead of --gpus: nodes of --gpus-per-node GPUs")
    pl.add_argument("--gpu-memory-gib", type=float, default=None,
                    help="memory of one GPU in GiB (default: this machine's GPU, else 80)")
    pl.add_argument("--gpus-per-node", type=int, default=8, help="GPUs joined by NVLink in one node (default 8)")
    pl.add_argument("--nvlink-gbps", type=float, default=360.0,
                    help="bandwidth per GPU inside a node, GB/s per direction (default 360: H100/H200 NVLink)")
    pl.add_argument("--network-gbps", type=float, default=45.0,
                    help="bandwidth per GPU between nodes, GB/s (default 45: one 400 Gb/s NIC per GPU)")
    pl.add_argument("--profile", default=None, help="a device profile (JSON) from --calibrate (default: the shipped "
                    "one of train.device, mimo/planner/profiles/)")
    pl.add_argument("--choose-microbatches", action="store_true", help="give each layout the parallel.microbatches "
                    "(a divisor of data.global_batch up to 64) it runs fastest at, instead of the config's")
    pl.add_argument("--json", action="store_true", help="print every candidate as JSON (fields: docs/planner.md)")
    pl.add_argument("--calibrate", action="store_true", help="measure this machine's device (train.device) at the "
                    "config's shapes and write a profile to --out instead of planning")
    pl.add_argument("--out", default="profile.json", help="where --calibrate writes (default profile.json)")
    pl.set_defaults(func=cmd_plan)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mimo", description="Train multimodal in/out models with a parallel "
                                "layout per module (encoders and LM each on their own TP/CP/PP/DP).")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train from a TOML config", description=TRAIN_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("config", help="path of a TOML config, e.g. configs/demo_vlm.toml")
    t.add_argument("--nproc", type=int, default=1, help="local processes (ranks) to launch (default 1)")
    t.set_defaults(func=cmd_train)
    c = sub.add_parser("config", help="explain config keys", description="Print a config key's doc, type, default "
                       "and allowed values, or with --reference every key (docs/configuration.md).")
    c.add_argument("key", nargs="*", help="dotted keys, e.g. perf.compile or model.modalities.images.vit.patch")
    c.add_argument("--reference", action="store_true", help="print the whole reference as Markdown")
    c.set_defaults(func=cmd_config)
    g = sub.add_parser("generate", help="greedy decoding from a trained run",
                       description="Answer prompts about an image and/or a sound with a trained run (greedy, KV "
                       "cache), one line out per prompt, in order: a newline inside an answer is written \\n and a "
                       "backslash \\\\ (or --jsonl). The prompt is laid out as the run trained (data.prompt_format).")
    g.add_argument("--run", required=True, help=RUN_HELP + ", e.g. runs/demo_vlm")
    g.add_argument("--image", action="append", help="image file (any size; resized to the encoder's input); "
                   "repeat it, one per --prompt, or give one for all; with <image> markers in the prompts, one "
                   "per marker, in prompt order (several images a prompt)")
    g.add_argument("--audio", action="append", help="audio file (wav; flac, ogg, ... with soundfile: pip install "
                   "-e '.[audio]'), resampled to 16 kHz; repeat it, one per prompt, or give one for all")
    g.add_argument("--prompt", action="append",
                   help="text after the image or clip, e.g. 'what color?', or with an <image> marker where each image "
                   "goes; repeat it for a batch")
    g.add_argument("--prompts", help="a file of prompts: one per line, or .jsonl lines of {\"prompt\": ..., \"image\": "
                   "..., \"audio\": ...} (paths relative to the file)")
    g.add_argument("--max-new-tokens", type=int, help=f"longest text answer (default {DEFAULT_NEW_TOKENS}); "
                   "not with --out")
    g.add_argument("--jsonl", action="store_true", help="write each answer as a JSON line: {\"prompt\": ..., "
                   "\"image\": [...], \"audio\": ..., \"answer\": ...}")
    g.add_argument("--out", help="write an image here instead of text (a run with an Out path, e.g. "
                   "runs/demo_text_to_image; one --prompt says what to draw; no --image/--audio)")
    g.set_defaults(func=cmd_generate)
    e = sub.add_parser("eval", help="held-out accuracy of a trained run",
                       description="Evaluate a trained run on its held-out set (exact match, greedy).")
    e.add_argument("--run", required=True, help=RUN_HELP)
    e.add_argument("--grid", help="text-to-image runs: also write a PNG of true renderings (left half) and generated "
                   "images (right half), one per colour and shape")
    e.set_defaults(func=cmd_eval)
    x = sub.add_parser("export", help="write a trained run as a Hugging Face model directory",
                       description="Export a trained run as a LlavaForConditionalGeneration directory (vision "
                       "tower + projector + LM), or with --lm-only the LM as a Qwen2/Qwen3/Llama causal LM.")
    x.add_argument("--run", required=True, help=RUN_HELP)
    x.add_argument("--to", required=True, help="new or empty output folder")
    x.add_argument("--lm-only", action="store_true", help="export only the language model")
    x.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 5GB, 500MB (default 5GB); "
                   "tensors stream one at a time from the sharded checkpoint")
    x.set_defaults(func=cmd_export)
    add_plan_parser(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        code = args.func(args, rest)
    except (ConfigError, FileNotFoundError) as e:
        from mimo.parallel.launch import report_error

        report_error(f"mimo: error: {e}")
        code = 2
    except Exception:
        from mimo.parallel.launch import report_crash, under_launcher

        if not under_launcher():
            raise
        report_crash()
        code = 1
    _leave_process_groups()
    sys.exit(code)


def _leave_process_groups() -> None:
    """Destroy this rank's process groups before the interpreter exits, however the command ended: left to
    interpreter shutdown, gloo's threads can abort the rank (exit code 134) after its error was reported."""
    if "torch.distributed" in sys.modules:  # never initialised otherwise; importing torch costs seconds
        from mimo.parallel.runtime import leave_distributed

        leave_distributed()
