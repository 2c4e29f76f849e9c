"""Edit a safetensors file's header or bytes without torch, to build the hostile inputs a user
might hand `model=hf`: a header whose offsets lie, an unknown dtype, trailing bytes, a header
length past the end of the file."""
from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path


def split(path: Path) -> tuple[dict, bytes]:
    """(header as a dict, the data section)."""
    return split_bytes(path.read_bytes())


def split_bytes(raw: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write(path: Path, header: dict | bytes, data: bytes) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def edit_header(path: Path, change: Callable[[dict], None]) -> None:
    """Apply `change` to the header dict and write the file back with the same data."""
    header, data = split(path)
    change(header)
    write(path, header, data)


def first_tensor(header: dict) -> str:
    return next(name for name in sorted(header) if name != "__metadata__")
