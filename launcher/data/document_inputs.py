"""Documents from local inputs for `meshrun data prepare`: text files, JSONL, Parquet.

A text file (any extension but .jsonl/.json/.parquet) is ONE document. A JSONL file holds one
document per line, in a string field (--text-field, default "text"). A Parquet file holds one
per row, in a string column (--column, default "text"; needs pyarrow, optional). Empty
documents are skipped. Order is the order of the inputs, then of lines/rows.
"""
from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)


def expand_inputs(inputs: list[str], *, exclude: Path | None = None) -> list[Path]:
    """Files as given; a folder = its files (recursively, sorted), without hidden files and
    anything under `exclude` (the --out folder). ValueError naming what is missing."""
    out: list[Path] = []
    skip = exclude.expanduser().resolve() if exclude is not None else None
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")
                          and not _under(f, skip))
        elif p.is_file():
            if _under(p, skip):
                raise ValueError(f"input {item}: is inside --out {exclude} (fix: keep the "
                                 "output apart from the inputs)")
            out.append(p)
        else:
            raise ValueError(f"input {item}: no such file or folder")
    if not out:
        raise ValueError("no input files: " + ", ".join(inputs) + " hold none (fix: name text, "
                         ".jsonl or .parquet files, or folders holding them)")
    return out


def _under(path: Path, folder: Path | None) -> bool:
    return folder is not None and path.resolve().is_relative_to(folder)


def hash_and_check(path: Path, digest) -> None:
    """Feed the file's bytes to `digest`; ValueError naming the file when a text or JSONL input
    is not UTF-8 text (a NUL byte: binary; an invalid sequence: another encoding)."""
    text = path.suffix.lower() not in PARQUET_SUFFIXES
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
            if text:
                _check_block(path, block, decoder, offset)
            offset += len(block)
    if text:
        _check_block(path, b"", decoder, offset, final=True)


def _check_block(path: Path, block: bytes, decoder, offset: int, *, final: bool = False) -> None:
    nul = block.find(b"\0")
    if nul >= 0:
        raise ValueError(f"input {path}: holds a NUL byte at offset {offset + nul}: a binary "
                         "file, not text (fix: leave it out, or convert it to UTF-8 text)")
    try:
        decoder.decode(block, final=final)
    except UnicodeDecodeError as err:
        raise ValueError(f"input {path}: not UTF-8 text (byte offset about {offset + err.start}: "
                         f"{err.reason}) (fix: convert it to UTF-8, e.g. iconv -t UTF-8)") from None


def read_documents(path: Path, *, text_field: str = "text",
                   column: str = "text") -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        yield from _parquet(path, column)
    elif suffix in JSONL_SUFFIXES:
        yield from _jsonl(path, text_field)
    else:
        text = path.read_text(encoding="utf-8", errors="strict")
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
    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError): the file is not Parquet
        raise ValueError(f"{path}: not a readable Parquet file ({err})") from None
    if column not in table.schema_arrow.names:
        raise ValueError(f"{path}: no column {column!r} (has {', '.join(table.schema_arrow.names)};"
                         " fix: --column NAME)")
    for batch in table.iter_batches(columns=[column]):
        for row, text in enumerate(batch.column(0).to_pylist()):
            if text is not None and not isinstance(text, str):
                raise ValueError(f"{path}: column {column!r} holds {type(text).__name__} values, "
                                 "not text (fix: --column NAME of a string column)")
            if text:
                yield text
