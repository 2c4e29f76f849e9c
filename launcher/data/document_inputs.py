"""Documents from local inputs for `meshrun data prepare`: text files, JSONL, Parquet.

A text file (any extension but .jsonl/.json/.parquet) is ONE document. A JSONL file holds one
document per line, in a string field (--text-field, default "text"). A Parquet file holds one
per row, in a string column (--column, default "text"; needs pyarrow, optional). Empty
documents are skipped. Order is the order of the inputs, then of lines/rows.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files as given; a folder = its files (recursively, sorted). ValueError naming what is missing."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"input {item}: no such file or folder")
    if not out:
        raise ValueError("no input files")
    return out


def read_documents(path: Path, *, text_field: str = "text",
                   column: str = "text") -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        yield from _parquet(path, column)
    elif suffix in JSONL_SUFFIXES:
        yield from _jsonl(path, text_field)
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text:
            yield text


def _jsonl(path: Path, field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err})") from None
            text = record.get(field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number}: no string field {field!r} (fix: "
                                 "--text-field NAME)")
            if text:
                yield text


def _parquet(path: Path, column: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow, which is not installed "
                         "(fix: pip install pyarrow, or convert to JSONL)") from None
    table = pq.ParquetFile(path)
    if column not in table.schema_arrow.names:
        raise ValueError(f"{path}: no column {column!r} (has {', '.join(table.schema_arrow.names)};"
                         " fix: --column NAME)")
    for batch in table.iter_batches(columns=[column]):
        for text in batch.column(0).to_pylist():
            if text:
                yield text
