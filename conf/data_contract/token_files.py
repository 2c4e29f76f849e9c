"""Token files checked before launch (data=files): a file that trains on garbage is refused here.

A raw `.bin` has no header, so a uint32 file read with the default data.dtype=uint16 would
train on every token's two halves, silently. resolve() therefore reads a few KB of each file
(numpy memmap; no torch) and checks: the file exists and holds tokens, its size is a whole
number of data.dtype tokens, the files hold at least one window of seq_len+1 tokens, the
sampled ids are below model.vocab_size, and the sample does not look like tokens twice as
wide (every other value 0). `.npy` files must be 1-D integer arrays.
"""
from __future__ import annotations

from pathlib import Path

from conf.errors import ProblemList
from conf.spec import TOKEN_DTYPES

SAMPLE_BYTES = 8192
"""Bytes read from the head and from the tail of each file for the id and dtype checks."""
MIN_GUESS_TOKENS = 64
"""Fewer sampled tokens than this: too few to guess the dtype from."""
HIGH_HALF_MAX = 3
"""The high half of an id below 2**18 in a type twice as wide as data.dtype is at most this."""
WIDER = {"uint8": "uint16", "uint16": "uint32", "uint32": "int64", "int32": "int64"}
"""The dtype whose little-endian halves look like `dtype` with every other value 0."""


def check_token_files(key: str, files: list[str], *, dtype: str, seq_len: int,
                      vocab_size: int, problems: ProblemList) -> None:
    """Add a problem for each file of `key` (data.train_files or data.val_files) that would
    not train on what its writer meant, and one if they hold less than one window."""
    import numpy as np

    total = 0
    for path in files:
        tokens = _open(key, path, dtype, problems, np)
        if tokens is None:
            continue
        total += len(tokens)
        n = SAMPLE_BYTES // tokens.itemsize
        sample = np.concatenate([np.asarray(tokens[:n]), np.asarray(tokens[-n:])]).astype(np.int64)
        if _looks_wider(sample, dtype, path, even=len(tokens) % 2 == 0):
            wider = WIDER[dtype]
            problems.add(key, path, f"read as {dtype}, every other value is 0 (or nearly): it "
                         f"looks like {wider} tokens read as {dtype}", f"set data.dtype={wider}")
        elif int(sample.max()) >= vocab_size or int(sample.min()) < 0:
            bad = int(sample.max()) if int(sample.max()) >= vocab_size else int(sample.min())
            problems.add(key, path, f"holds token id {bad} (read as {dtype}), outside "
                         f"[0, model.vocab_size={vocab_size})",
                         "raise model.vocab_size to the tokenizer's, or check data.dtype")
    if files and 0 < total < seq_len + 1:
        problems.add(key, ", ".join(files), f"hold {total} tokens: fewer than one window of "
                     f"training.seq_len+1={seq_len + 1}", "give more tokens or a shorter seq_len")


def _open(key: str, path: str, dtype: str, problems: ProblemList, np):
    """The file's tokens as a 1-D memmap, or None after adding the problem that stops it."""
    if not Path(path).is_file():
        problems.add(key, path, "does not exist", "check the path or glob")
        return None
    size = Path(path).stat().st_size
    if path.endswith(".npy"):
        try:
            tokens = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as err:
            problems.add(key, path, f"is not a readable .npy file ({err})",
                         "save token ids with numpy.save, or name a raw file .bin")
            return None
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            problems.add(key, path, f"holds a {tokens.ndim}-D {tokens.dtype} array; token files "
                         "are 1-D integer arrays", "save token ids as a flat integer array")
            return None
        if tokens.size == 0:
            problems.add(key, path, "holds no tokens", "give a non-empty token file")
            return None
        return tokens
    if dtype not in TOKEN_DTYPES:
        return None  # reported as data.dtype
    item = TOKEN_DTYPES[dtype]
    if size == 0:
        problems.add(key, path, "is empty", "give a non-empty token file")
        return None
    if size % item:
        problems.add(key, path, f"is {size} bytes: not a whole number of {dtype} tokens "
                     f"({item} bytes each)", "set data.dtype to the dtype the file was written in")
        return None
    return np.memmap(path, dtype=dtype, mode="r")


def _looks_wider(sample, dtype: str, path: str, *, even: bool) -> bool:
    """Every odd value below HIGH_HALF_MAX and some even one not: the high halves of wider
    little-endian ids (`even`: the file holds an even number of tokens, as such a file must).
    Not quite 0 covers vocabularies above 65536 (llama3's ids reach 2**17)."""
    if path.endswith(".npy") or dtype not in WIDER or not even or len(sample) < MIN_GUESS_TOKENS:
        return False
    return int(sample[1::2].max()) <= HIGH_HALF_MAX < int(sample[0::2].max())
