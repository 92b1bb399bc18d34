"""Hugging Face safetensors shards written one tensor at a time.

The header of a safetensors file lists every tensor's dtype, shape and byte range, all of which are known
before any tensor is read (from the checkpoint's index); so each file is written as header, then each
tensor's bytes as soon as it is produced and dropped. The peak is one tensor, whatever the model's size.
Shards of at most `max_shard_bytes` (one larger tensor gets a shard of its own) with the standard
`model.safetensors.index.json`, or a single `model.safetensors`. A `Source` gives each module's tensors by
name: its own (`LiveSource`) or a run's checkpoint (`CheckpointSource`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mimo.export.tokens import make_readable, save_generation_config
from mimo.hf.files import INDEX
from mimo.hf.names import ExpertStack, HFName
from mimo.train.checkpoint.tensors import CheckpointTensors

MAX_SHARD_BYTES = 5 * 2**30
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


@dataclass(frozen=True)
class Entry:
    """One tensor to write: its Hugging Face name, shape, dtype (as written) and how to make it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


def plan_shards(entries: list[Entry], max_shard_bytes: int) -> list[list[Entry]]:
    """Consecutive groups of at most `max_shard_bytes` (a tensor larger than that alone)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def write_safetensors(path: Path, entries: list[Entry]) -> None:
    """One safetensors file holding `entries`, each made, checked, written and dropped in turn."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": DTYPES[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for e in entries:
            t = e.make().to(e.dtype).contiguous().cpu()
            if tuple(t.shape) != e.shape:
                raise ValueError(f"'{e.name}': made shape {tuple(t.shape)}, expected {e.shape}")
            f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            del t
    tmp.replace(path)


def save_streamed(entries: list[Entry], directory: Path, max_shard_bytes: int | None = None) -> list[Path]:
    """model.safetensors, or model-0000k-of-0000n.safetensors shards plus model.safetensors.index.json."""
    shards = plan_shards(entries, max_shard_bytes or MAX_SHARD_BYTES)
    if len(shards) == 1:
        write_safetensors(directory / "model.safetensors", shards[0])
        return [directory / "model.safetensors"]
    weight_map, files = {}, []
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(directory / file, shard)
        weight_map.update({e.name: file for e in shard})
        files.append(directory / file)
    total = sum(e.nbytes for e in entries)
    (directory / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return files


class LiveSource:
    """A module's own tensors (module-relative state-dict names)."""

    def __init__(self, module: nn.Module):
        self.state = module.state_dict()

    def dtype(self, name: str) -> torch.dtype:
        return self.state[name].dtype

    def read(self, name: str) -> torch.Tensor:
        return self.state[name]


class CheckpointSource:
    """The tensors of the module called `prefix` in a MimoModel, each read whole from a checkpoint only when
    its entry is written (mimo.train.checkpoint.tensors)."""

    def __init__(self, tensors: CheckpointTensors, prefix: str):
        self.tensors, self.prefix = tensors, prefix

    def dtype(self, name: str) -> torch.dtype:
        return self.tensors.shape_dtype(self.prefix + name)[1]

    def read(self, name: str) -> torch.Tensor:
        return self.tensors.read(self.prefix + name)


Source = LiveSource | CheckpointSource


def prepare_dir(directory: str | Path) -> Path:
    """`directory`, created if need be; refused if it already holds a model."""
    out = Path(directory)
    if out.exists() and ((out / "config.json").exists() or any(out.glob("*.safetensors"))):
        raise FileExistsError(f"'{out}' already holds a model; export into a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_hf_dir(directory: str | Path, entries: dict[str, Entry], config: Any, max_shard_bytes: int | None = None,
                 files: Callable[[Path], None] | None = None, ids: dict[str, int | None] | None = None) -> Path:
    """A Hugging Face model folder in `directory` (new or empty, `prepare_dir`): the weights streamed one tensor at
    a time (`save_streamed`), `config`, and where `files` is given, what it writes (tokenizer, processor) with a
    generation_config.json of the token `ids`; every file readable by all. The folder."""
    out = prepare_dir(directory)
    save_streamed(list(entries.values()), out, max_shard_bytes)
    config.save_pretrained(out)
    if files is not None:
        files(out)
        save_generation_config(ids or {}, out)
    make_readable(out)
    return out


SourceOf = Callable[[nn.Module], Source]
"""Where a module's tensors come from: `LiveSource` (the default) or a run's checkpoint (`export_run`)."""


def gather_entries(module: nn.Module, names: dict[str, HFName], dtype: torch.dtype | None,
                   source_of: SourceOf = LiveSource) -> dict[str, Entry]:
    """{HF name: Entry}, read from the module's source only when written; the parts of a fused tensor (`Rows`)
    are concatenated in row order, a stacked tensor (`ExpertStack`) is written one expert at a time (read once
    for its consecutive experts). Shapes are the module's own (a model on the meta device has them)."""
    src = source_of(module)
    state = module.state_dict()
    out: dict[str, Entry] = {}
    parts: dict[str, list[tuple[int, str]]] = {}
    for ours, hf in names.items():
        if isinstance(hf, ExpertStack):
            read = _expert_reader(src, ours, len(hf.names))
            for e, name in enumerate(hf.names):
                out[name] = Entry(name, tuple(state[ours].shape[1:]), dtype or src.dtype(ours), partial(read, e))
        elif isinstance(hf, str):
            out[hf] = Entry(hf, tuple(state[ours].shape), dtype or src.dtype(ours), partial(src.read, ours))
        else:
            parts.setdefault(hf[0], []).append((hf[1], ours))
    for hf, pieces in parts.items():
        keys = [ours for _, ours in sorted(pieces)]
        rows = sum(state[k].shape[0] for k in keys)
        out[hf] = Entry(hf, (rows, *state[keys[0]].shape[1:]), dtype or src.dtype(keys[0]),
                        lambda keys=keys, src=src: torch.cat([src.read(k) for k in keys]))
    return out


def _expert_reader(src: Source, name: str, experts: int) -> Callable[[int], torch.Tensor]:
    """`read(e)`: expert e of the stacked tensor `name`, read from `src` once and held until its last expert is
    taken (the writer takes them in a row, so the peak stays one tensor)."""
    held: list[torch.Tensor] = []

    def read(e: int) -> torch.Tensor:
        if not held:
            held.append(src.read(name))
        piece = held[0][e].clone()
        if e == experts - 1:
            held.clear()
        return piece

    return read
