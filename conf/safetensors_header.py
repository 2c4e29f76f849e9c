"""A safetensors file read by its header alone, torch-free, with every rule the format has.

The layout: 8 bytes (little-endian u64 N), N bytes of a JSON object {tensor name: {"dtype",
"shape", "data_offsets": [start, end]}, optional "__metadata__": {str: str}}, then the tensor
bytes, offsets counted from the end of the header. A file is sound when the header is sane
(N within the file and under the format's own 100 MB cap, UTF-8 JSON, no name twice), every
dtype is known, every shape a list of non-negative integers whose product times the dtype's
size is end - start, and the tensors tile the data section exactly: no overlap, no gap, no byte
past the end of the file (a truncated file fails here). The same checks the safetensors library
makes when it opens a file, said as one sentence a person can act on.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000
"""The safetensors library's own cap on the header's length."""
METADATA_KEY = "__metadata__"
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
              "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
"""Every dtype the safetensors format names, by bits per element."""


class BadSafetensors(ValueError):
    """The file is not a sound safetensors file; the message says which rule it breaks."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor as the header describes it."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    """Offset of its first byte in the data section (after the header)."""
    end: int


def read_header(path: str | Path) -> dict[str, TensorEntry]:
    """Tensor name -> entry, from `path`'s header; BadSafetensors names the broken rule."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise BadSafetensors(f"has {size} bytes: too short for the 8-byte header length")
            (length,) = struct.unpack("<Q", prefix)
            _check_length(length, size)
            raw = handle.read(length)
    except OSError as err:
        raise BadSafetensors(f"cannot be read ({err.strerror or err})") from err
    entries = _parse(raw)
    _check_tiling(entries, data_bytes=size - 8 - length)
    return entries


def _check_length(length: int, size: int) -> None:
    if length > MAX_HEADER_BYTES:
        raise BadSafetensors(f"declares a {length}-byte header, over the format's cap of "
                             f"{MAX_HEADER_BYTES} (not a safetensors file?)")
    if 8 + length > size:
        raise BadSafetensors(f"declares a {length}-byte header but the file has only {size} "
                             "bytes (truncated, or not a safetensors file)")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen = {}
    for name, value in pairs:
        if name in seen:
            raise BadSafetensors(f"its header names {name!r} twice")
        seen[name] = value
    return seen


def _no_constant(name: str) -> None:
    raise BadSafetensors(f"its header holds {name}, which is not JSON")


def _parse(raw: bytes) -> dict[str, TensorEntry]:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                            parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadSafetensors(f"its header is not UTF-8 JSON ({err})") from err
    if not isinstance(header, dict):
        raise BadSafetensors(f"its header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadSafetensors(f"its header's {METADATA_KEY} is not an object of strings")
    return {name: _entry(name, info) for name, info in header.items()}


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass: true/false are not sizes


def _entry(name: str, info: object) -> TensorEntry:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise BadSafetensors(f"tensor {name}: header entry must be an object with exactly "
                             f"dtype, shape and data_offsets (got {_short(info)})")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise BadSafetensors(f"tensor {name}: dtype {_short(dtype)} is not a safetensors dtype "
                             f"({', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        raise BadSafetensors(f"tensor {name}: shape {_short(shape)} is not a list of "
                             "non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(n) and n >= 0 for n in offsets) or offsets[0] > offsets[1]):
        raise BadSafetensors(f"tensor {name}: data_offsets {_short(offsets)} is not "
                             "[start, end] with 0 <= start <= end")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise BadSafetensors(f"tensor {name}: {dtype} {shape} needs {bits / 8:g} bytes but "
                             f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
    return TensorEntry(dtype=dtype, shape=tuple(shape), start=offsets[0], end=offsets[1])


def _check_tiling(entries: dict[str, TensorEntry], *, data_bytes: int) -> None:
    """The tensors cover the data section exactly, each byte once (as safetensors requires)."""
    expected = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].start, item[1].end)):
        if entry.start < expected:
            raise BadSafetensors(f"tensor {name}: data_offsets [{entry.start}, {entry.end}] "
                                 f"overlap the tensor before it (which ends at {expected})")
        if entry.start > expected:
            raise BadSafetensors(f"tensor {name}: data_offsets start at {entry.start}, leaving "
                                 f"a gap after byte {expected}")
        expected = entry.end
    if expected > data_bytes:
        raise BadSafetensors(f"its tensors need {expected} bytes of data but the file holds "
                             f"{data_bytes} after the header (truncated?)")
    if expected < data_bytes:
        raise BadSafetensors(f"holds {data_bytes - expected} bytes after its last tensor "
                             "(not what the header describes)")


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def tensor_bytes(path: str | Path, entry: TensorEntry) -> bytes:
    """The raw bytes of one tensor of a file whose header `read_header` accepted."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        handle.seek(8 + length + entry.start)
        return handle.read(entry.end - entry.start)
