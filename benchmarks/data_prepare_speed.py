"""Tokens/s of `meshrun data prepare` against the `tokenizers` library's own encode_batch on
the same text (a report, not a timed test).

  python benchmarks/data_prepare_speed.py [--mb 8] [--vocab-size 4096] [--workers 1 2]

Corpus: this Python's standard library .py files (one document each), the first --mb MB.
prepare's time includes reading, hashing the inputs, the split, and writing shards + manifest.
encode_batch is multi-threaded (Rust/rayon) in one process; prepare --workers 1 calls it too.
"""
from __future__ import annotations

import argparse
import sysconfig
import tempfile
import time
from pathlib import Path

from launcher.shards import PrepareOptions, prepare
from launcher.hf_tokenizer import load_tokenizer, train_bpe


def corpus(limit_bytes: int) -> list[Path]:
    files, total = [], 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if total >= limit_bytes:
            break
        files.append(f)
        total += f.stat().st_size
    return files


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
            start = time.perf_counter()
            m = prepare([str(f) for f in files], tokenizer=str(tok), out_dir=f"{tmp}/p{workers}",
                        options=PrepareOptions(val_fraction=0.01), workers=workers).manifest
            took = time.perf_counter() - start
            print(f"data prepare --workers {workers}         : {m['tokens'] / took:12,.0f} "
                  f"tokens/s ({took:.2f} s, {m['tokens']:,} tokens incl. BOS/EOS)")
        start = time.perf_counter()
        prepare([str(f) for f in files], tokenizer=str(tok), out_dir=f"{tmp}/p{workers}",
                options=PrepareOptions(val_fraction=0.01), workers=workers)
        print(f"data prepare, second call (no-op) : {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
