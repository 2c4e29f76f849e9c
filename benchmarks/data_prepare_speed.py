"""Tokens/s of `meshrun data prepare` against the `tokenizers` library's own encode_batch on
the same text (a report, not a timed test); with tiktoken installed, the same for a tiktoken
rank file (the trained BPE's ranks) against tiktoken's own encode_ordinary_batch.

  python benchmarks/data_prepare_speed.py [--mb 8] [--vocab-size 4096] [--workers 1 2]

Corpus: this Python's standard library .py files (one document each), the first --mb MB.
prepare's time includes reading, hashing the inputs, the split, and writing shards + manifest.
encode_batch is multi-threaded (Rust/rayon) in one process; prepare --workers 1 calls it too.
"""
from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import sysconfig
import tempfile
import time
from pathlib import Path

from launcher.data.token_shards import PrepareOptions, prepare
from launcher.data.hf_tokenizer import load_tokenizer, train_bpe


def corpus(limit_bytes: int) -> list[Path]:
    files, total = [], 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if total >= limit_bytes:
            break
        files.append(f)
        total += f.stat().st_size
    return files


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (what a ByteLevel BPE's tokens spell)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    return {c: b for b, c in chars.items()}


def write_tiktoken_ranks(tokenizer_json: Path, out: Path) -> Path:
    """The trained BPE's tokens as a tiktoken rank file (ranks in id order: merge order)."""
    data = json.loads(tokenizer_json.read_text())
    specials = {t["content"] for t in data["added_tokens"]}
    alphabet = byte_level_alphabet()
    tokens = sorted((i, t) for t, i in data["model"]["vocab"].items() if t not in specials)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(bytes(alphabet[c] for c in t)).decode()} {rank}"
             for rank, (_, t) in enumerate(tokens)]
    (out / "tokenizer.model").write_text("\n".join(lines) + "\n")
    return out


def time_prepare(files: list[Path], tok: Path, out: str, workers: int, label: str) -> None:
    start = time.perf_counter()
    m = prepare([str(f) for f in files], tokenizer=str(tok), out_dir=out,
                options=PrepareOptions(val_fraction=0.01), workers=workers).manifest
    took = time.perf_counter() - start
    print(f"{label:34}: {m['tokens'] / took:12,.0f} tokens/s ({took:.2f} s, {m['tokens']:,} "
          f"tokens incl. BOS/EOS)")


def tiktoken_lines(files: list[Path], texts: list[str], tok: Path, tmp: str) -> None:
    ranks = write_tiktoken_ranks(tok, Path(tmp) / "tiktoken")
    encoding = load_tokenizer(ranks).backend
    start = time.perf_counter()
    n = sum(map(len, encoding.encode_ordinary_batch(texts)))
    took = time.perf_counter() - start
    print(f"{'tiktoken encode_ordinary_batch':34}: {n / took:12,.0f} tokens/s ({took:.2f} s)")
    time_prepare(files, ranks, f"{tmp}/t1", 1, "prepare (tiktoken) --workers 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=8)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    files = corpus(int(args.mb * 2**20))
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_bpe(files[:200], vocab_size=args.vocab_size, out_dir=Path(tmp) / "tok")
        texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
        backend = load_tokenizer(tok).backend
        start = time.perf_counter()
        n = sum(len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False))
        base = time.perf_counter() - start
        print(f"{len(files)} documents, {sum(map(len, texts)) / 2**20:.1f} M chars, {n:,} tokens")
        print(f"tokenizers encode_batch           : {n / base:12,.0f} tokens/s ({base:.2f} s)")
        for workers in args.workers:
            time_prepare(files, tok, f"{tmp}/p{workers}", workers,
                         f"data prepare --workers {workers}")
        start = time.perf_counter()
        prepare([str(f) for f in files], tokenizer=str(tok), out_dir=f"{tmp}/p{workers}",
                options=PrepareOptions(val_fraction=0.01), workers=workers)
        print(f"data prepare, second call (no-op) : {time.perf_counter() - start:.2f} s")
        if importlib.util.find_spec("tiktoken") is not None:  # optional
            tiktoken_lines(files, texts, tok, tmp)


if __name__ == "__main__":
    main()
