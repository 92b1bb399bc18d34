"""Peak resident memory of every rank, phase by phase, for one model on one process and on 4 gloo ranks.

    python -m benchmarks.bench_memory [--steps 2] [--layout single --layout tp4 ...] [--out DIR]

The model: the demo VLM's ViT and a Qwen2-style LM of hidden 1024 x 16 layers, vocab 32000, mlp 3072
(0.26 B parameters), trained on the shapes demo (global batch 4) in fp32 on the CPU. Each layout runs in
its own processes (`torchrun` for 4 ranks): build (`Trainer(cfg)`: the meta-device build, layout and
materialisation), train (`--steps` steps), save (the final sharded checkpoint), then `mimo export` of the
run in a fresh process (streamed into safetensors shards of at most 512 MB). A thread samples each
process's resident set every 2 ms (and the kernel's high-water mark where it can be reset), so each
phase's figure is that phase's own peak. Layouts: single (one process), tp4 (LM tp4, encoder data
parallel), fsdp4 (both modules FSDP over 4 ranks), pipe (encoder on rank 0, LM pp3 on ranks 1-3). Next to
each, `mimo plan`'s host-memory estimate of the worst rank (mimo.planner.memory.host_estimate).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo_vlm.toml"
GIB = 1024**3
MODEL = ["--model.llm.hidden=1024", "--model.llm.layers=16", "--model.llm.heads=16", "--model.llm.kv_heads=4",
         "--model.llm.mlp=3072", "--model.llm.vocab=32000", "--data.global_batch=4", "--data.train_samples=64",
         "--data.eval_samples=4", "--optim.warmup_steps=1", "--train.threads=1", "--metrics.progress=false",
         "--metrics.tensorboard=false", "--train.log_every=1"]
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
LAYOUTS = {
    "single": (1, []),
    "tp4": (4, [f"{LANG}.tp=4"]),
    "fsdp4": (4, [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"]),
    "pipe": (4, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=3", f"{LANG}.pp=3",
                 "--parallel.microbatches=2"]),
}
PHASES = ("build", "train", "save")


class PeakRSS:
    """This process's peak resident set since the last `reset`, in bytes: a 2 ms sampler, and the kernel's
    VmHWM where /proc/self/clear_refs lets it be reset (Linux)."""

    def __init__(self):
        self.peak = 0
        self.hwm_resettable = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._status("VmRSS"))

    def reset(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.hwm_resettable = True
        except OSError:
            self.hwm_resettable = False
        self.peak = self._status("VmRSS")

    def read(self) -> int:
        hwm = self._status("VmHWM") if self.hwm_resettable else 0
        return max(self.peak, self._status("VmRSS"), hwm)


def _phase(rss: PeakRSS, record: dict, name: str, fn):
    if dist.is_initialized():
        dist.barrier()
    rss.reset()
    out = fn()
    if dist.is_initialized():
        dist.barrier()
    record[name] = rss.read()
    return out


def worker(layout: str, out: str, steps: int) -> None:
    """One rank of one layout (under torchrun for 4 ranks): the three phases' peaks as one JSON line."""
    from mimo.config.load import load_config
    from mimo.train.trainer import Trainer

    rss = PeakRSS()
    cfg = load_config(DEMO, [*MODEL, *LAYOUTS[layout][1], f"--run.out_dir={out}", f"--run.name={layout}",
                             f"--train.steps={steps}"])
    record: dict = {"layout": layout, "rank": int(os.environ.get("RANK", 0)), "start": rss.read()}
    trainer = _phase(rss, record, "build", lambda: Trainer(cfg))
    record["params_held"] = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                                for p in trainer.model.parameters())
    _phase(rss, record, "train", lambda: [trainer.train_step(s) for s in range(steps)])
    _phase(rss, record, "save", lambda: trainer.checkpointer.save_final(steps))
    trainer.write_run_config(steps)  # config.toml, which `mimo export` reads (rank 0)
    # A file per rank: torchrun interleaves the ranks' stdout lines.
    (Path(out) / f"{layout}_rank{record['rank']}.json").write_text(json.dumps(record))


def export_worker(run: str, to: str) -> None:
    """`mimo export` of a run in this process, its peak as one JSON line."""
    from mimo.export.run import export_run

    rss = PeakRSS()
    record = {"start": rss.read()}
    rss.reset()
    export_run(run, to, max_shard_bytes=512 * 10**6)
    record["export"] = rss.read()
    print("BENCH " + json.dumps(record), flush=True)


def _bench_lines(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("BENCH ")]


def run_layout(layout: str, out: Path, steps: int) -> list[dict]:
    nproc = LAYOUTS[layout][0]
    me = [sys.executable, "-m", "benchmarks.bench_memory", "--worker", layout, "--out", str(out), "--steps", str(steps)]
    if nproc > 1:
        me = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
              "-m", "benchmarks.bench_memory", *me[3:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(me, capture_output=True, text=True, cwd=ROOT, env=env)
    rows = [json.loads(f.read_text()) for f in sorted(out.glob(f"{layout}_rank*.json"))]
    rows.sort(key=lambda x: x["rank"])
    if r.returncode or len(rows) != nproc:
        raise RuntimeError(f"layout {layout} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    x = subprocess.run([sys.executable, "-m", "benchmarks.bench_memory", "--export-worker", str(out / layout),
                        str(out / f"{layout}_hf")], capture_output=True, text=True, cwd=ROOT, env=env)
    exported = _bench_lines(x.stdout)
    if x.returncode or not exported:
        raise RuntimeError(f"export of {layout} failed:\n{x.stderr[-3000:]}")
    for row in rows:
        row["export"] = exported[0]["export"] if row["rank"] == 0 else None
    return rows


def estimates(layouts: list[str], out: Path) -> dict[str, dict[str, float]]:
    """`mimo plan`'s host estimate of each layout's worst rank, per phase (bytes)."""
    from mimo.config.load import load_config
    from mimo.parallel.layout import Layout
    from mimo.planner.memory import host_estimate

    result = {}
    for name in layouts:
        world, overrides = LAYOUTS[name]
        cfg = load_config(DEMO, [*MODEL, *overrides, f"--run.out_dir={out}"])
        layout = Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world)
        result[name] = host_estimate(cfg, layout)
    return result


def table(rows: list[dict], est: dict[str, dict[str, float]]) -> str:
    single = max(max(r[p] for p in PHASES) for r in rows if r["layout"] == "single")
    lines = ["| layout | rank | build GiB | train GiB | save GiB | export GiB | peak / single | plan estimate GiB "
             "(build / train / export) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        peak = max(r[p] for p in PHASES)
        e = est.get(r["layout"], {})
        estimate = " / ".join(f"{e[k] / GIB:.2f}" for k in ("build", "train", "export")) if r["rank"] == 0 else ""
        export = f"{r['export'] / GIB:.2f}" if r["export"] is not None else ""
        lines.append(f"| {r['layout']} | {r['rank']} | {r['build'] / GIB:.2f} | {r['train'] / GIB:.2f} | "
                     f"{r['save'] / GIB:.2f} | {export} | {peak / single:.2f}x | {estimate} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=list(LAYOUTS))
    ap.add_argument("--export-worker", nargs=2, metavar=("RUN", "TO"))
    ap.add_argument("--layout", action="append", choices=list(LAYOUTS))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.worker:
        torch.set_num_threads(1)
        return worker(args.worker, str(args.out), args.steps)
    if args.export_worker:
        return export_worker(*args.export_worker)
    layouts = args.layout or list(LAYOUTS)
    if "single" not in layouts:
        layouts = ["single", *layouts]
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_memory_"))
    rows = []
    for name in layouts:
        t0 = time.perf_counter()
        rows += run_layout(name, out, args.steps)
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(table(rows, estimates(layouts, out)))
    (out / "bench_memory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
