"""Reading DCP checkpoints without executing pickled code.

DCP stores tensors through `torch.load(weights_only=True)`, but its `.metadata` index is a plain pickle,
and a plain `pickle.load` of a tampered file can run arbitrary code. This reader unpickles the index
with an allowlist: only DCP's own metadata records, torch dtypes/layouts/sizes and paths may be named;
anything else is refused before it is constructed. Checkpoints written by mimo hold tensors only, so
a non-tensor (pickled bytes) entry in the index is refused too.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

_ALLOWED: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "MetadataIndex",
        "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint._extension": {"StreamTransformExtension"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class CorruptCheckpointError(RuntimeError):
    """A checkpoint folder is unreadable or names something it may not; the message says which file."""


class _AllowlistUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"'{module}.{name}' is not allowed in a checkpoint index")


def read_metadata_file(path: str | os.PathLike) -> Metadata:
    """Unpickle a DCP `.metadata` file with the allowlist; raises CorruptCheckpointError on anything else."""
    p = Path(path)
    try:
        meta = _AllowlistUnpickler(io.BytesIO(p.read_bytes())).load()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError, TypeError, IndexError) as e:
        raise CorruptCheckpointError(f"checkpoint index '{p}' is unreadable ({e}); the checkpoint is corrupt") from e
    if not isinstance(meta, Metadata):
        raise CorruptCheckpointError(f"checkpoint index '{p}' holds a {type(meta).__name__}, not DCP metadata")
    pickled = [k for k, v in meta.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    if pickled:
        raise CorruptCheckpointError(f"checkpoint index '{p}' lists non-tensor entries {pickled[:3]}; mimo "
                                     "checkpoints hold tensors only, so this one is refused")
    return meta


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata is read by `read_metadata_file` (tensors load weights-only)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        meta = read_metadata_file(self._get_metadata_path(kwargs.get("rank")))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta
