"""Read back what an offline W&B run wrote, for tests (wandb 0.31 ships no reader).

File layout of `<dir>/wandb/offline-run-<time>-<id>[-N]/run-<id>.wandb`, as written by wandb-core
(core/pkg/leveldb/record.go and the store's header writer):

- a 7-byte file header: ident `:W&B`, magic 0xBEE1 (uint16 LE), version 0 (uint8);
- then a LevelDB log: 32 KiB blocks (the header sits in the first block), each holding chunks
  with a 7-byte `<IHB` header (checksum, payload length, chunk type) and the payload. The checksum
  is plain CRC-32 (IEEE, `zlib.crc32`) over the type byte and the payload. Types: FULL=1, FIRST=2,
  MIDDLE=3, LAST=4. Fewer than 7 bytes left in a block are zero padding;
- each reassembled record is a serialized `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

FILE_HEADER = struct.Struct("<4sHB")
FILE_IDENT = b":W&B"
FILE_MAGIC = 0xBEE1
CHUNK_HEADER = struct.Struct("<IHB")
BLOCK_SIZE = 32 * 1024
CHUNK_FULL, CHUNK_FIRST, CHUNK_MIDDLE, CHUNK_LAST = 1, 2, 3, 4
INTERNAL_KEY_PREFIX = "_"  # W&B's own keys: _step, _runtime, _timestamp, _wandb, ...


class WandbFileError(ValueError):
    """The file is not a readable .wandb run file."""


@dataclass(kw_only=True)
class WandbRunRecords:
    """Everything a test needs from one W&B run (one offline-run dir, or several merged)."""

    run_id: str = ""
    project: str = ""
    entity: str = ""
    name: str = ""
    group: str = ""
    tags: tuple[str, ...] = ()
    resumed: bool = False  # W&B's server said it resumed a run (online only; offline stays False)
    resume_requested: bool = False  # init asked for resume ("allow", "must", ...)
    start_time_s: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    sources: tuple[Path, ...] = ()
    stats: list[dict[str, Any]] = field(default_factory=list)
    """System-metric samples (W&B's System panels), one dict per sample: `cpu`, `memory_percent`,
    `proc.memory.rssMB`, `gpu.0.gpu`, ..."""
    console: list[tuple[str, str]] = field(default_factory=list)
    """Captured console output (the Logs tab) as (stream, text) pieces, stream "stdout"/"stderr"."""
    metric_definitions: list[dict[str, Any]] = field(default_factory=list)
    """`define_metric` calls: {"name" or "glob_name", "step_metric", ...}."""

    def console_text(self, stream: str | None = None) -> str:
        """The captured console output, optionally of one stream only."""
        return "".join(text for name, text in self.console if stream in (None, name))

    def user_config(self) -> dict[str, Any]:
        """Config without W&B's own `_wandb` entry."""
        return _drop_internal_keys(self.config)

    def user_history(self) -> list[dict[str, Any]]:
        """History rows without `_step`, `_runtime`, `_timestamp`."""
        return [_drop_internal_keys(row) for row in self.history]

    def user_summary(self) -> dict[str, Any]:
        """Summary without W&B's own `_...` entries."""
        return _drop_internal_keys(self.summary)


def find_offline_runs(run_dir: Path) -> list[Path]:
    """All `run-<id>.wandb` files under `<run_dir>/wandb/offline-run-*/`, sorted by folder name."""
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))


def read_run(path: Path) -> WandbRunRecords:
    """Decode one `.wandb` file into a `WandbRunRecords`."""
    view = WandbRunRecords(sources=(Path(path),))
    for record in iter_records(path):
        _apply_record(view, record)
    return view


def read_runs(run_dir: Path, *, run_id: str | None = None) -> WandbRunRecords:
    """Merge every offline-run segment of one run id under `run_dir`, oldest first.

    A resumed run writes one more `offline-run-*` folder for the same id. History is
    concatenated in start-time order; config and summary take the newest value of each key.
    """
    segments = [read_run(path) for path in find_offline_runs(run_dir)]
    run_ids = {segment.run_id for segment in segments}
    if run_id is None and len(run_ids) > 1:
        raise ValueError(f"{run_dir}: several run ids {sorted(run_ids)}; pass run_id=")
    wanted = [s for s in segments if run_id is None or s.run_id == run_id]
    if not wanted:
        raise FileNotFoundError(f"no offline W&B run {run_id or ''} under {run_dir}/wandb")
    wanted.sort(key=lambda segment: segment.start_time_s)
    return _merge_segments(wanted)


def iter_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """Yield every `Record` protobuf stored in a `.wandb` file, in write order."""
    data = Path(path).read_bytes()
    _check_file_header(data, path=path)
    for payload in _iter_payloads(data, path=path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _check_file_header(data: bytes, *, path: Path) -> None:
    if len(data) < FILE_HEADER.size:
        raise WandbFileError(f"{path}: {len(data)} bytes, shorter than the file header")
    ident, magic, version = FILE_HEADER.unpack_from(data, 0)
    if ident != FILE_IDENT or magic != FILE_MAGIC:
        raise WandbFileError(f"{path}: header {data[:7]!r} is not ':W&B' with magic 0xBEE1")
    if version != 0:
        raise WandbFileError(f"{path}: unsupported .wandb version {version}")


def _iter_payloads(data: bytes, *, path: Path) -> Iterator[bytes]:
    """Reassemble LevelDB-log chunks into record payloads."""
    pending: bytearray | None = None
    for chunk_type, payload in _iter_chunks(data, path=path):
        if chunk_type == CHUNK_FULL:
            yield payload
        elif chunk_type == CHUNK_FIRST:
            pending = bytearray(payload)
        elif chunk_type in (CHUNK_MIDDLE, CHUNK_LAST) and pending is not None:
            pending += payload
            if chunk_type == CHUNK_LAST:
                yield bytes(pending)
                pending = None
        else:
            raise WandbFileError(f"{path}: chunk type {chunk_type} out of order")


def _iter_chunks(data: bytes, *, path: Path) -> Iterator[tuple[int, bytes]]:
    position = FILE_HEADER.size
    while position < len(data):
        left_in_block = BLOCK_SIZE - position % BLOCK_SIZE
        if left_in_block < CHUNK_HEADER.size:
            position += left_in_block  # zero trailer
            continue
        if position + CHUNK_HEADER.size > len(data):
            raise WandbFileError(f"{path}: truncated chunk header at byte {position}")
        checksum, length, chunk_type = CHUNK_HEADER.unpack_from(data, position)
        if checksum == 0 and length == 0 and chunk_type == 0:
            position += left_in_block  # zeroed rest of block
            continue
        start = position + CHUNK_HEADER.size
        payload = data[start : start + length]
        if len(payload) != length or length > left_in_block - CHUNK_HEADER.size:
            raise WandbFileError(f"{path}: chunk at byte {position} overruns its block")
        if zlib.crc32(bytes([chunk_type]) + payload) != checksum:
            raise WandbFileError(f"{path}: checksum mismatch in chunk at byte {position}")
        yield chunk_type, payload
        position = start + length


def _apply_record(view: WandbRunRecords, record: wandb_internal_pb2.Record) -> None:
    kind = record.WhichOneof("record_type")
    if kind == "run":
        _apply_run(view, record.run)
    elif kind == "config":
        _apply_updates(view.config, record.config.update, record.config.remove)
    elif kind == "history":
        view.history.append({_item_key(item): _history_value(item) for item in record.history.item})
    elif kind == "summary":
        _apply_updates(view.summary, record.summary.update, record.summary.remove)
    elif kind == "exit":
        view.exit_code = record.exit.exit_code
    elif kind == "stats":
        view.stats.append({item.key: json.loads(item.value_json) for item in record.stats.item})
    elif kind in ("output", "output_raw"):
        output = getattr(record, kind)
        stream = "stderr" if output.output_type == wandb_internal_pb2.OutputRecord.STDERR else "stdout"
        view.console.append((stream, output.line))
    elif kind == "metric":
        view.metric_definitions.append(_metric_definition(record.metric))


def _metric_definition(metric: wandb_internal_pb2.MetricRecord) -> dict[str, Any]:
    definition = {"name": metric.name} if metric.name else {"glob_name": metric.glob_name}
    if metric.step_metric:
        definition["step_metric"] = metric.step_metric
    kept = [name for name in ("min", "max", "mean", "last", "best", "none", "copy")
            if getattr(metric.summary, name, False)]
    if kept:
        definition["summary"] = ",".join(kept)
    return definition


def _apply_run(view: WandbRunRecords, run: wandb_internal_pb2.RunRecord) -> None:
    view.run_id = run.run_id
    view.project = run.project
    view.entity = run.entity
    view.name = run.display_name
    view.group = run.run_group
    view.tags = tuple(run.tags)
    view.resumed = run.resumed
    view.resume_requested = run.resume
    view.start_time_s = run.start_time.seconds + run.start_time.nanos / 1e9
    _apply_updates(view.config, run.config.update, run.config.remove)
    _apply_updates(view.summary, run.summary.update, run.summary.remove)


def _apply_updates(target: dict[str, Any], updates: Any, removals: Any) -> None:
    for item in updates:
        target[_item_key(item)] = json.loads(item.value_json)
    for item in removals:
        target.pop(_item_key(item), None)


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _history_value(item: wandb_internal_pb2.HistoryItem) -> Any:
    if item.value_json:
        return json.loads(item.value_json)
    kind = item.WhichOneof("value")
    if kind is None or kind == "none":
        return None
    if kind == "json":
        return json.loads(item.json)
    return getattr(item, kind)


def _drop_internal_keys(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not k.startswith(INTERNAL_KEY_PREFIX)}


def _merge_segments(segments: list[WandbRunRecords]) -> WandbRunRecords:
    merged = WandbRunRecords()
    for segment in segments:
        for name in ("run_id", "project", "entity", "name", "group", "tags"):
            setattr(merged, name, getattr(segment, name) or getattr(merged, name))
        merged.config.update(segment.config)
        merged.summary.update(segment.summary)
        merged.history.extend(segment.history)
        merged.exit_code = segment.exit_code
        merged.stats.extend(segment.stats)
        merged.console.extend(segment.console)
        merged.metric_definitions.extend(segment.metric_definitions)
        merged.resumed = merged.resumed or segment.resumed
        merged.resume_requested = merged.resume_requested or segment.resume_requested
    merged.start_time_s = segments[0].start_time_s
    merged.sources = tuple(path for segment in segments for path in segment.sources)
    return merged
