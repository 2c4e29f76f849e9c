"""DCP loading that never unpickles arbitrary objects.

torch 2.13's `FileSystemReader.read_metadata` calls `pickle.load` on `.metadata`, and
`DefaultLoadPlanner.load_bytes` calls `torch.load(weights_only=False)` on every non-tensor
entry: a planted file in someone else's run dir would run code on `checkpoint.load_from`.
Here `.metadata` is read by an Unpickler that resolves only the allow-list in
conf.run_dir.checkpoint_verify, and byte entries (optimizer hyper-parameters) load with
weights_only=True.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from conf.run_dir.checkpoint_verify import AllowListUnpickler, UnsafeCheckpoint, refusal


class _MetadataUnpickler(AllowListUnpickler):
    """The allow-list of conf.run_dir.checkpoint_verify, resolving the real classes (and only dtypes
    or torch.Size from the torch namespace)."""

    def resolve(self, module: str, name: str):
        found = pickle.Unpickler.find_class(self, module, name)
        if module == "torch" and name != "Size" and not isinstance(found, torch.dtype):
            raise UnsafeCheckpoint(refusal(self.path, module, name))
        return found


def load_dcp_metadata(path: Path) -> Metadata:
    """Unpickle DCP's `.metadata` file at `path` with the allow-list; UnsafeCheckpoint if it
    names anything else, or is not DCP metadata at all."""
    with open(path, "rb") as handle:
        metadata = _MetadataUnpickler(handle, path=Path(path)).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose `read_metadata` uses the allow-listed Unpickler."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = load_dcp_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor entries load with weights_only=True."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
