"""This process's random number generator states as plain JSON (torch, CUDA, numpy, Python).

Stored per rank in each checkpoint so that a resumed run draws the same random numbers as the run
it continues. JSON rather than pickle: a checkpoint must load without executing code.
"""

from __future__ import annotations

import base64
import random

import numpy as np
import torch


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng() -> dict:
    """The current RNG states of this process, JSON-serialisable."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": _b64(torch.get_rng_state()),
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def check_rng(state: object) -> None:
    """Raise ValueError unless `state` is what `capture_rng` returns: every part is decoded and tried on
    scratch generators, so a garbled file is found before anything is restored."""
    try:
        if not isinstance(state, dict):
            raise TypeError(f"a {type(state).__name__}, not an object")
        torch.Generator().set_state(_unb64(state["torch"]))
        n = state["numpy"]
        np.random.RandomState().set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"],
                                           n["has_gauss"], n["cached_gaussian"]))
        p = state["python"]
        random.Random().setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
        for s in state.get("cuda", []):
            _unb64(s)
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise ValueError(f"not an RNG state ({type(e).__name__}: {e})") from e


def restore_rng(state: dict) -> None:
    """Put back the states `capture_rng` returned (CUDA only where both sides have it)."""
    torch.set_rng_state(_unb64(state["torch"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]][: torch.cuda.device_count()])
