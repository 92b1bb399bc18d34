"""A device profile: what the cost model knows about one GPU (or CPU), measured by `mimo plan --calibrate`.

Every figure is a straight-line fit of measured times against work, so it can be checked by hand:

- matrix products: `time = matmul_fixed_s + flop / (matmul_tflops * 1e12)`, fitted over bf16 products of
  the shapes transformer layers run (the fixed part covers launch and the low efficiency of small shapes);
- attention (SDPA over `[b, heads, s, head_dim]`): the same line over the FLOPs `mimo.models.flops` counts
  (a causal one at half), forward; the backward costs `attention_backward_ratio` forwards;
- element-wise work: `bytes / (memory_gbps * 1e9)` (a large bf16 add: read two, write one);
- `kernel_s`: the GPU time of one tiny kernel; `launch_s`: the host time to issue one eagerly;
- `layer_factor`: measured / modelled time of one whole layer (forward + backward) of each module kind
  (`decoder`, `vit`, `audio`) with `.eager` or `.compiled` after it, measured at `layer_shapes`: what the
  line fits leave out (norms, RoPE, casts, the autograd bookkeeping), applied to every layer of that kind.

Profiles are JSON files; `mimo/planner/profiles/` ships one for the H200 and one for CPUs (made with
`mimo plan --calibrate --out ...`, see BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from mimo.config.schema import ConfigError

PROFILES = Path(__file__).resolve().parent / "profiles"
"""The shipped profiles, one JSON file per device kind."""


@dataclass(frozen=True)
class Profile:
    """Fitted throughput figures of one device (see the module docstring for each line)."""

    device: str
    matmul_tflops: float
    matmul_fixed_s: float
    attention_tflops: float
    attention_fixed_s: float
    attention_backward_ratio: float
    memory_gbps: float
    kernel_s: float
    launch_s: float
    layer_factor: dict[str, float] = field(default_factory=dict)
    layer_shapes: dict[str, dict] = field(default_factory=dict)
    measured: dict = field(default_factory=dict)

    def factor(self, kind: str, compiled: bool) -> float:
        """The layer correction of `kind` ('decoder', 'vit', 'audio'), compiled or eager; 1.0 when not measured
        (the compiled figure falls back to the eager one)."""
        mode = "compiled" if compiled else "eager"
        return self.layer_factor.get(f"{kind}.{mode}", self.layer_factor.get(f"{kind}.eager", 1.0))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True) + "\n")


def load_profile(path: Path) -> Profile:
    """A profile from its JSON file, refusing a missing file or missing fields by name."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--profile {path}: no such file; make one with `mimo plan --calibrate --out {path}` or "
                          f"use a shipped one ({', '.join(p.name for p in sorted(PROFILES.glob('*.json')))})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--profile {path}: not JSON ({e}); make it again with `mimo plan --calibrate`") from None
    names = {f.name for f in dataclasses.fields(Profile)}
    required = {f.name for f in dataclasses.fields(Profile) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    missing = sorted(required - set(raw))
    if missing:
        raise ConfigError(f"--profile {path}: missing {', '.join(missing)}; make it again with `mimo plan --calibrate`")
    return Profile(**{k: v for k, v in raw.items() if k in names})


def shipped_profile(device: str) -> Profile:
    """The shipped profile for `device`: 'h200' (and any CUDA device) or 'cpu'."""
    return load_profile(PROFILES / ("cpu.json" if device == "cpu" else "h200.json"))
