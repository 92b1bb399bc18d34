"""Read-only views of Hugging Face weights: a model directory (safetensors, single or sharded) or a live
`transformers` model. Tensors are read one at a time, and only the requested slice of each, so importing
never holds a second full copy of a model and a tensor-parallel rank reads only its shard. A whole tensor
is read with plain file reads straight into its parameter (`read_into`), not through a memory map whose
pages would stay resident beside the model until the file closes.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from torch import nn

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


class TensorSlice(Protocol):
    """What safetensors' `get_slice` returns: a shape and lazy indexing (`sl[a:b]`, `sl[:, a:b]`, `sl[:]`)."""

    def get_shape(self) -> list[int]: ...

    def __getitem__(self, index: Any) -> torch.Tensor: ...


class InMemorySlice:
    """A `TensorSlice` over a tensor that is already loaded (the live-model source)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.tensor[index].detach()


class RowsSlice:
    """A `TensorSlice` over rows [start, end) of another (a part of a fused tensor): indexing is relative to the
    part and reads only what it names."""

    def __init__(self, whole: TensorSlice, start: int, end: int):
        self.whole, self.start, self.end = whole, start, end

    def get_shape(self) -> list[int]:
        return [self.end - self.start, *self.whole.get_shape()[1:]]

    def __getitem__(self, index: Any) -> torch.Tensor:
        index = index if isinstance(index, tuple) else (index,)
        first = index[0] if index else slice(None)
        if not isinstance(first, slice) or first.step not in (None, 1):
            raise ValueError(f"a part of a fused tensor is read by contiguous row ranges, not {first!r}")
        lo, hi, _ = first.indices(self.end - self.start)
        return self.whole[(slice(self.start + lo, self.start + hi), *index[1:])]


class StackSlice:
    """A `TensorSlice` over several equal-shape tensors stacked along a new dim 0 (a mixture of experts' per-expert
    tensors as mimo's `[E, ...]`): indexing dim 0 picks the tensors, and only those are read."""

    def __init__(self, parts: list[TensorSlice]):
        self.parts = parts

    def get_shape(self) -> list[int]:
        return [len(self.parts), *self.parts[0].get_shape()]

    def __getitem__(self, index: Any) -> torch.Tensor:
        index = index if isinstance(index, tuple) else (index,)
        first = index[0] if index else slice(None)
        if not isinstance(first, slice) or first.step not in (None, 1):
            raise ValueError(f"stacked expert tensors are read by contiguous expert ranges, not {first!r}")
        lo, hi, _ = first.indices(len(self.parts))
        return torch.stack([part[index[1:]] if index[1:] else part[:] for part in self.parts[lo:hi]])


class WeightSource(ABC):
    """Names, lazy slices and config of one set of HF weights; `where(name)` says which file holds a tensor."""

    label: str
    config_label: str

    @abstractmethod
    def keys(self) -> list[str]: ...

    @abstractmethod
    def where(self, name: str) -> str: ...

    @abstractmethod
    def get_slice(self, name: str) -> TensorSlice: ...

    @abstractmethod
    def config(self) -> dict[str, Any]: ...

    @abstractmethod
    def dtype_of(self, name: str) -> torch.dtype:
        """The dtype the source stores tensor `name` in."""

    def read_into(self, name: str, target: torch.Tensor) -> None:
        """Copy the whole tensor `name` (of `target`'s shape) into `target`, casting to its dtype and device."""
        target.copy_(self.get_slice(name)[:])

    @abstractmethod
    def close(self) -> None:
        """Release open files."""

    def __enter__(self) -> WeightSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DirectorySource(WeightSource):
    """A model directory: config.json plus model.safetensors, or shards listed in model.safetensors.index.json."""

    def __init__(self, directory: str | Path):
        self.root = Path(directory)
        self.label = str(self.root)
        self.config_label = str(self.root / CONFIG)
        if not self.root.is_dir():
            raise FileNotFoundError(f"Hugging Face model directory '{self.root}' does not exist; pass a folder "
                                    "holding config.json and *.safetensors")
        self.files: dict[str, Path] = {}
        index = self.root / INDEX
        if index.is_file():
            for name, file in json.loads(index.read_text())["weight_map"].items():
                self.files[name] = self.root / file
        else:
            shards = sorted(self.root.glob("*.safetensors"))
            if not shards:
                hint = (" (it has only pickled PyTorch weights, which mimo never loads: re-save the model with "
                        "save_pretrained(..., safe_serialization=True))") if any(self.root.glob("*.bin")) else ""
                raise FileNotFoundError(f"no *.safetensors weights in '{self.root}'{hint}")
            for shard in shards:
                with safe_open(str(shard), framework="pt") as f:
                    for name in f.keys():
                        self.files[name] = shard
        self._open: dict[Path, Any] = {}
        self._headers: dict[Path, tuple[int, dict[str, Any]]] = {}

    def keys(self) -> list[str]:
        return list(self.files)

    def _entry(self, name: str) -> tuple[Path, int, dict[str, Any]]:
        """(file, offset of its data section, the header entry of `name`: dtype, shape, data_offsets)."""
        self.get_slice(name)  # the same errors for a missing tensor or file
        file = self.files[name]
        if file not in self._headers:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                self._headers[file] = (8 + size, json.loads(f.read(size)))
        start, header = self._headers[file]
        return file, start, header[name]

    def dtype_of(self, name: str) -> torch.dtype:
        kind = self._entry(name)[2]["dtype"]
        if kind not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor '{name}' in '{self.where(name)}' is stored as {kind}, which mimo does not read")
        return SAFETENSORS_DTYPES[kind]

    def read_into(self, name: str, target: torch.Tensor) -> None:
        """Plain reads into `target` itself when it is a contiguous CPU tensor of the stored dtype, else into one
        temporary tensor that is then cast and copied."""
        file, start, entry = self._entry(name)
        dtype = self.dtype_of(name)
        direct = target.device.type == "cpu" and target.dtype == dtype and target.is_contiguous()
        buffer = target if direct else torch.empty(entry["shape"], dtype=dtype)
        begin, end = entry["data_offsets"]
        if buffer.numel() * buffer.element_size() != end - begin:
            raise ValueError(f"tensor '{name}' in '{file}' holds {end - begin} bytes, not the "
                             f"{buffer.numel() * buffer.element_size()} of shape {entry['shape']}: the file is damaged")
        if buffer.numel():
            view = memoryview(buffer.reshape(-1).view(torch.uint8).numpy())
            with open(file, "rb", buffering=0) as f:
                f.seek(start + begin)
                done = 0
                while done < len(view):
                    got = f.readinto(view[done:])
                    if not got:
                        raise ValueError(f"'{file}' ends inside tensor '{name}': the file is truncated")
                    done += got
        if not direct:
            target.copy_(buffer)

    def where(self, name: str) -> str:
        return str(self.files.get(name, self.root))

    def get_slice(self, name: str) -> TensorSlice:
        if name not in self.files:
            raise ValueError(f"tensor '{name}' is not in the weights of '{self.root}'; the directory does not "
                             "hold the architecture the config describes")
        file = self.files[name]
        if file not in self._open:
            if not file.is_file():
                raise FileNotFoundError(f"tensor '{name}' should be in '{file}', which is missing; copy the "
                                        f"complete checkpoint (every shard named in {INDEX})")
            self._open[file] = safe_open(str(file), framework="pt")
        return self._open[file].get_slice(name)

    def config(self) -> dict[str, Any]:
        path = self.root / CONFIG
        if not path.is_file():
            raise FileNotFoundError(f"'{path}' is missing; a Hugging Face model directory needs its config.json")
        return json.loads(path.read_text())

    def close(self) -> None:
        self._open.clear()
        self._headers.clear()


class ModelSource(WeightSource):
    """A live `transformers` model: its state dict and its config."""

    def __init__(self, model: nn.Module):
        if not hasattr(model, "config"):
            raise ValueError(f"{type(model).__name__} has no .config; pass a transformers model or a directory")
        self.model = model
        self.label = f"<{type(model).__name__} object>"
        self.config_label = f"the config of {self.label}"
        self.state = checkpoint_state(model)

    def keys(self) -> list[str]:
        return list(self.state)

    def where(self, name: str) -> str:
        return self.label

    def get_slice(self, name: str) -> TensorSlice:
        if name not in self.state:
            raise ValueError(f"tensor '{name}' is not in {self.label}; the model does not hold the architecture "
                             "the config describes")
        return InMemorySlice(self.state[name])

    def config(self) -> dict[str, Any]:
        return self.model.config.to_dict()

    def dtype_of(self, name: str) -> torch.dtype:
        self.get_slice(name)
        return self.state[name].dtype

    def close(self) -> None:
        """Nothing to release: the model owns its tensors."""


def checkpoint_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A live model's tensors under the names (and splits) of its checkpoint files, the ones mimo's name maps
    read: transformers 5 converts some on load (DINOv2's attention.attention.query to attention.q_proj, MoE
    experts stacked into one tensor) and reverts that in save_pretrained, which this does the same way. Older
    transformers converts nothing."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return model.state_dict()
    return dict(revert_weight_conversion(model, model.state_dict()))


def open_source(source: str | Path | nn.Module | WeightSource) -> WeightSource:
    """A directory path, a `transformers` model object or an already open source."""
    if isinstance(source, WeightSource):
        return source
    if isinstance(source, nn.Module):
        return ModelSource(source)
    return DirectorySource(source)
