"""`meshrun data prepare`: documents -> token shards + manifest, parallel, idempotent, atomic.

Each document becomes [BOS] ids EOS (BOS only where the tokenizer has one). Document i (counted
over all inputs, in order) goes to validation when floor((i+1)*f) > floor(i*f), f = val_fraction:
deterministic, and exactly round(n*f) documents. Documents are tokenized in chunks by a process
pool (imap keeps their order), and the token streams are cut into shards of exactly
shard_tokens (the last one shorter), so the shards depend on the inputs, tokenizer and options,
never on the number of workers. Each shard is written as NAME.tmp, fsynced and renamed; the
manifest (conf/data_contract/prepared_corpus.py) is written last, the same way. A second call whose fingerprint
(inputs' sha256, tokenizer's sha256, options) matches the manifest, with every shard in place,
does nothing. An interrupted call leaves no manifest, but whenever a shard is finished it
records its progress (PROGRESS: chunks done, shards, document counts, and each split's
not-yet-sharded tail in SPLIT.pending.K), written atomically after the shard; the next call with
the same fingerprint continues after those chunks and writes the same shards an uninterrupted
call would. Anything else in the dir (another fingerprint, a missing shard) starts it over.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import multiprocessing
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from conf.data_contract.prepared_corpus import FORMAT, MANIFEST, SPLITS, incomplete_shards, read_manifest
from conf.data_contract.manifest_schema import confined
from conf.data_contract.prepared_corpus import shard_checksums
from conf.data_contract.shard_checks import ShardChecksumError, verify_shard
from launcher.data.document_inputs import expand_inputs, hash_and_check, read_documents
from launcher.data.hf_tokenizer import encode_batch, load_tokenizer
from launcher.data.output_dir import check_out_dir, os_problem, prepared_name, write_marker

PROGRESS = "progress.json"
CHUNK_DOCS = 512
CHUNK_CHARS = 4 << 20
"""A chunk (one task for a worker) holds at most this many documents / characters."""
MAX_SHARD_TOKENS = 1 << 32
"""--shard-tokens above this (16 GiB of uint32 per shard, held in memory while cut) is refused."""
MAX_WORKERS_PER_CPU = 4
COMMAND = "data prepare"


@dataclass(frozen=True, kw_only=True)
class PrepareOptions:
    text_field: str = "text"
    column: str = "text"
    val_fraction: float = 0.01
    shard_tokens: int = 1 << 28
    bos_token: str = ""
    eos_token: str = ""
    parse_special: bool = False
    """True: a special token's text inside a document becomes that token (default: it stays
    text, with either tokenizer backend, so a document cannot end itself by quoting EOS)."""


@dataclass
class PrepareResult:
    out_dir: Path
    manifest: dict
    skipped: bool
    """True: the dir was already prepared from these inputs; nothing was written."""


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def prepare(inputs: list[str], *, tokenizer: str, out_dir: str, options: PrepareOptions,
            workers: int = 0, progress=None) -> PrepareResult:
    """ValueError for bad input (named); see the module docstring for everything else."""
    check_options(options, workers=workers)
    tok = load_tokenizer(tokenizer, bos_token=options.bos_token, eos_token=options.eos_token)
    if tok.info.eos_id is None:
        raise ValueError(f"tokenizer {tok.info.path} has no EOS token I recognise (fix: name "
                         "it with --eos-token)")
    out = check_out_dir(out_dir, command=COMMAND, own_name=prepared_name)
    files = expand_inputs(inputs, exclude=out)
    fingerprint = _fingerprint(files, tok.info.sha256, options)
    done = _finished(out, fingerprint)
    if done is not None:
        return PrepareResult(out, done, skipped=True)
    if next(_chunks(files, options), None) is None:
        raise ValueError(no_documents(files, options))
    try:
        return _prepare(out, files, tok, fingerprint, options, workers, progress)
    except OSError as err:
        raise os_problem(err, out) from None


def _prepare(out: Path, files: list[Path], tok, fingerprint: str, options: PrepareOptions,
             workers: int, progress) -> PrepareResult:
    dtype = token_dtype(tok.vocab_size)
    saved = _resume_or_clear(out, fingerprint, dtype)
    writers = {s: ShardWriter(out, s, dtype=dtype, shard_tokens=options.shard_tokens,
                              resume=saved["splits"].get(s)) for s in SPLITS}
    docs = saved["docs"]
    meter = _Progress(sum(f.stat().st_size for f in files), progress)
    encoded = _encode_all(files, tok.info, options, workers, skip=saved["chunks"])
    for chunk, (chunk_chars, parts) in enumerate(encoded, saved["chunks"] + 1):
        written = sum(len(w.shards) for w in writers.values())
        for split, (tokens, n_docs) in zip(SPLITS, parts):
            writers[split].add(tokens)
            docs[split] += n_docs
        if sum(len(w.shards) for w in writers.values()) > written:
            _save_progress(out, fingerprint, chunk, docs, writers)
        meter.update(chunk_chars, sum(w.tokens for w in writers.values()))
    meter.done()
    manifest = {
        "format": FORMAT, "fingerprint": fingerprint, "dtype": dtype,
        "tokenizer": {k: getattr(tok.info, k) for k in
                      ("path", "sha256", "vocab_size", "bos_id", "eos_id", "pad_id")},
        "inputs": [{"path": str(f.resolve()), "bytes": f.stat().st_size} for f in files],
        "options": asdict(options),
        "documents": sum(docs.values()), "tokens": sum(w.tokens for w in writers.values()),
        "splits": {s: {"documents": docs[s], **writers[s].close()} for s in SPLITS},
    }
    _write_atomic(out / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    _remove_progress(out)
    return PrepareResult(out, manifest, skipped=False)


class ShardWriter:
    """Cuts one split's token stream into shards of exactly shard_tokens; atomic writes."""

    def __init__(self, out: Path, split: str, *, dtype: str, shard_tokens: int,
                 resume: dict | None = None):
        self.out, self.split, self.dtype, self.shard_tokens = out, split, dtype, shard_tokens
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.tokens = 0
        self.shards: list[dict] = []
        if resume:  # continue from a saved progress record (see _save_progress)
            tail = np.fromfile(out / resume["pending_file"], dtype=dtype)
            self.pending, self.pending_tokens = [tail], len(tail)
            self.tokens, self.shards = resume["tokens"], list(resume["shards"])

    def save_pending(self, chunk: int) -> dict:
        """Write the not-yet-sharded tail (SPLIT.pending.CHUNK); its progress record."""
        name = f"{self.split}.pending.{chunk}"
        tail = np.concatenate(self.pending) if self.pending else np.empty(0, self.dtype)
        _write_atomic(self.out / name, np.ascontiguousarray(tail, dtype=self.dtype).tobytes())
        return {"tokens": self.tokens, "shards": self.shards, "pending_file": name,
                "pending_tokens": len(tail)}

    def add(self, tokens: np.ndarray) -> None:
        self.pending.append(tokens.astype(self.dtype, copy=False))
        self.pending_tokens += len(tokens)
        self.tokens += len(tokens)
        while self.pending_tokens >= self.shard_tokens:
            stream = np.concatenate(self.pending)
            self._write(stream[:self.shard_tokens])
            rest = stream[self.shard_tokens:]
            self.pending, self.pending_tokens = [rest], len(rest)

    def close(self) -> dict:
        if self.pending_tokens:
            self._write(np.concatenate(self.pending))
        self.pending, self.pending_tokens = [], 0
        return {"tokens": self.tokens, "shards": self.shards}

    def _write(self, tokens: np.ndarray) -> None:
        name = f"{self.split}_{len(self.shards):05d}.bin"
        data = np.ascontiguousarray(tokens).tobytes()
        _write_atomic(self.out / name, data)
        self.shards.append({"file": name, "tokens": len(tokens),
                            "sha256": hashlib.sha256(data).hexdigest()})


def check_options(options: PrepareOptions, *, workers: int) -> None:
    """ValueError naming the flag of the first option out of its range."""
    if not 0 <= options.val_fraction < 1:
        raise ValueError(f"--val-fraction={options.val_fraction}: must be in [0, 1)")
    if not 1 <= options.shard_tokens <= MAX_SHARD_TOKENS:
        raise ValueError(f"--shard-tokens={options.shard_tokens}: must be in 1..{MAX_SHARD_TOKENS}"
                         " (a shard is cut in memory)")
    cpus = os.cpu_count() or 1
    if not 0 <= workers <= MAX_WORKERS_PER_CPU * cpus:
        raise ValueError(f"--workers={workers}: must be in 0..{MAX_WORKERS_PER_CPU * cpus} "
                         f"(0 = one per CPU; this host has {cpus})")


def no_documents(files: list[Path], options: PrepareOptions) -> str:
    """Why a prepare would write nothing."""
    return (f"no documents in {len(files)} input file(s) ({files[0]}, ...): every text file is "
            f"empty and every JSONL line / Parquet row has an empty {options.text_field!r} / "
            f"{options.column!r} (fix: give non-empty text, or --text-field / --column naming "
            "the field that holds it); nothing was written")


def _write_atomic(path: Path, data: bytes) -> None:
    """path.tmp, fsynced, renamed to path; a failed write leaves no .tmp behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None:
            err.filename = str(path)
        raise


def _fingerprint(files: list[Path], tokenizer_sha: str, options) -> str:
    """sha256 over format, tokenizer, options and every input's path and bytes; refuses (a
    named ValueError) a text/JSONL input that is not UTF-8 text."""
    h = hashlib.sha256(f"{FORMAT}\n{tokenizer_sha}\n{sorted(asdict(options).items())}\n".encode())
    for f in files:
        h.update(f"{f.resolve()}\n".encode())
        hash_and_check(f, h)
    return h.hexdigest()


def _finished(out: Path, fingerprint: str) -> dict | None:
    """The manifest, when `out` is already prepared from these inputs and every shard is whole
    and holds the bytes the manifest's sha256 records."""
    try:
        manifest = read_manifest(out)
    except ValueError:
        return None
    if manifest.get("fingerprint") != fingerprint or incomplete_shards(out, manifest):
        return None
    try:
        for path, expected in shard_checksums(out, manifest).items():
            verify_shard(path, expected)
    except (ShardChecksumError, OSError):
        return None
    return manifest


def _clear(out: Path, *, command: str = COMMAND) -> None:
    """Make `out` an empty prepared dir: the manifest goes first, so no reader sees it list a
    shard being rewritten. Only files this module writes are removed."""
    out.mkdir(exist_ok=True)
    write_marker(out, command=command)
    (out / MANIFEST).unlink(missing_ok=True)
    for split in SPLITS:
        for f in out.glob(f"{split}_*.bin*"):
            f.unlink()
    (out / (MANIFEST + ".tmp")).unlink(missing_ok=True)
    _remove_progress(out)


def _save_progress(out: Path, fingerprint: str, chunks: int, docs: dict,
                   writers: dict[str, ShardWriter]) -> None:
    """Record that `chunks` chunks are in shards or pending tails; then drop older tails."""
    splits = {s: w.save_pending(chunks) for s, w in writers.items()}
    record = {"fingerprint": fingerprint, "chunks": chunks, "docs": dict(docs), "splits": splits}
    _write_atomic(out / PROGRESS, (json.dumps(record) + "\n").encode())
    keep = {s["pending_file"] for s in splits.values()}
    for f in out.glob("*.pending.*"):
        if f.name not in keep:
            f.unlink()


def _progress(out: Path, fingerprint: str, dtype: str) -> dict | None:
    """The saved progress of an interrupted call with this fingerprint, when every shard and
    pending tail it names is in place at its recorded size; else None."""
    try:
        record = json.loads((out / PROGRESS).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("fingerprint") != fingerprint:
        return None
    try:
        splits = record["splits"]
        view = {"dtype": dtype, "splits": {s: {"shards": splits[s]["shards"]} for s in SPLITS}}
        tails = [(confined(out, splits[s]["pending_file"], "pending_file"),
                  splits[s]["pending_tokens"]) for s in SPLITS]
        for s in SPLITS:
            for shard in splits[s]["shards"]:
                confined(out, shard["file"], "file")
        whole = not incomplete_shards(out, view)
    except (KeyError, TypeError, ValueError):  # not a record this module wrote: start over
        return None
    item = np.dtype(dtype).itemsize
    tails_ok = all(f.is_file() and f.stat().st_size == n * item for f, n in tails)
    return record if whole and tails_ok else None


def _resume_or_clear(out: Path, fingerprint: str, dtype: str) -> dict:
    """The saved progress to continue from, or (after emptying the dir) a fresh one."""
    saved = _progress(out, fingerprint, dtype)
    if saved is None:
        _clear(out)
        saved = {"chunks": 0, "docs": {s: 0 for s in SPLITS}, "splits": {}}
    return saved


def _remove_progress(out: Path) -> None:
    (out / PROGRESS).unlink(missing_ok=True)
    for f in out.glob("*.pending.*"):
        f.unlink()


def _chunks(files: list[Path], options: PrepareOptions) -> Iterator[tuple[int, list[str]]]:
    """(index of the chunk's first document, documents), in input order."""
    first, docs, chars = 0, [], 0
    for f in files:
        for text in read_documents(f, text_field=options.text_field, column=options.column):
            docs.append(text)
            chars += len(text)
            if len(docs) >= CHUNK_DOCS or chars >= CHUNK_CHARS:
                yield first, docs
                first, docs, chars = first + len(docs), [], 0
    if docs:
        yield first, docs


_WORKER: dict = {}


def _init_worker(info, val_fraction: float, threads: bool, parse_special: bool = False) -> None:
    if not threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from launcher.data.hf_tokenizer import load_backend

    _WORKER.update(backend=load_backend(info), kind=info.kind, bos=info.bos_id, eos=info.eos_id,
                   f=val_fraction, parse_special=parse_special)


def _encode_chunk(task: tuple[int, list[str]]):
    """(characters, ((train tokens, train docs), (val tokens, val docs))) for one chunk."""
    first, docs = task
    w = _WORKER
    encoded = encode_batch(w["backend"], docs, kind=w["kind"], special_text=w["parse_special"])
    head = [] if w["bos"] is None else [w["bos"]]
    parts: dict[bool, list[list[int]]] = {False: [], True: []}
    for i, ids in enumerate(encoded, first):
        is_val = math.floor((i + 1) * w["f"]) > math.floor(i * w["f"])
        parts[is_val].append(head + ids + [w["eos"]])
    out = tuple((np.fromiter((t for doc in parts[v] for t in doc), dtype=np.uint32),
                 len(parts[v])) for v in (False, True))
    return sum(len(d) for d in docs), out


def _encode_all(files: list[Path], info, options: PrepareOptions, workers: int, *,
                skip: int = 0):
    """Encoded chunks in order, after the first `skip` (read, not tokenized): in this process
    for workers=1, else a process pool."""
    workers = workers or os.cpu_count() or 1
    init = (info, options.val_fraction, workers == 1, options.parse_special)
    chunks = itertools.islice(_chunks(files, options), skip, None)
    if workers == 1:
        _init_worker(*init)
        yield from map(_encode_chunk, chunks)
        return
    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, init) as pool:
        yield from pool.imap(_encode_chunk, chunks, chunksize=1)


class _Progress:
    """One progress line on stderr (a terminal only), rewritten at most twice a second."""

    def __init__(self, total_bytes: int, stream):
        self.total, self.stream = total_bytes, stream
        self.chars, self.tokens, self.start, self.last = 0, 0, time.monotonic(), 0.0

    def update(self, chars: int, tokens: int) -> None:
        self.chars, self.tokens = self.chars + chars, tokens
        now = time.monotonic()
        if self.stream is not None and now - self.last >= 0.5:
            self.last = now
            rate = self.tokens / max(now - self.start, 1e-9)
            pct = min(100.0, 100 * self.chars / max(self.total, 1))
            self.stream.write(f"\rtokenizing: ~{pct:5.1f}% of text, {self.tokens:,} tokens, "
                              f"{rate:,.0f} tokens/s")
            self.stream.flush()

    def done(self) -> None:
        if self.stream is not None and self.last:
            self.stream.write("\n")
