"""Token files read as training windows: memory-mapped token files, non-overlapping windows of
seq_len+1 tokens over them, and the seeded order windows are visited in. Torch-free (numpy).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from conf.data_contract.shard_checks import verify_shard
from conf.spec import TOKEN_DTYPES


def open_token_file(path: str, *, dtype: str) -> np.ndarray:
    """Memory-map a 1-D token file: .npy (its own dtype) or raw .bin of `dtype`, one of
    conf.spec.TOKEN_DTYPES (the table resolve() checks data.dtype against)."""
    if path.endswith(".npy"):
        tokens = np.load(path, mmap_mode="r")
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"{path}: expected a 1-D integer array, got {tokens.ndim}-D "
                             f"{tokens.dtype}")
        return tokens
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"data.dtype={dtype!r}: raw token files need one of "
                         f"{', '.join(TOKEN_DTYPES)}")
    item_size = TOKEN_DTYPES[dtype]
    assert np.dtype(dtype).itemsize == item_size, (dtype, item_size)
    size = os.path.getsize(path)
    if size % item_size:
        raise ValueError(f"{path}: {size} bytes is not a whole number of {dtype} tokens "
                         "(is data.dtype right?)")
    if size == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class TokenDataset:
    """Non-overlapping windows of seq_len+1 tokens over token files concatenated in order.
    `checksums` (path -> sha256, from a prepared dir's manifest): each file is verified the
    first time a window reads from it (ShardChecksumError naming it)."""

    def __init__(self, files: Sequence[str], *, dtype: str, seq_len: int,
                 checksums: dict[str, str] | None = None):
        if not files:
            raise ValueError("no token files given")
        self.files = tuple(files)
        self._unverified = {i: checksums[f] for i, f in enumerate(self.files)
                            if checksums and f in checksums}
        self.seq_len = seq_len
        self._arrays = [open_token_file(f, dtype=dtype) for f in self.files]
        self._starts = np.cumsum([0] + [len(a) for a in self._arrays])
        self.n_tokens = int(self._starts[-1])
        self.n_windows = self.n_tokens // (seq_len + 1)
        if self.n_windows == 0:
            raise ValueError(f"{len(files)} token file(s) ({self.files[0]}, ...) hold "
                             f"{self.n_tokens} tokens: fewer than one sample of "
                             f"seq_len+1={seq_len + 1}")

    def __len__(self) -> int:
        return self.n_windows

    def windows(self, indices: np.ndarray) -> np.ndarray:
        """int64 [len(indices), seq_len+1]: the windows at these indices."""
        length = self.seq_len + 1
        return np.stack([self._read(int(i) * length, length) for i in indices])

    def _read(self, start: int, length: int) -> np.ndarray:
        file_index = int(np.searchsorted(self._starts, start, side="right")) - 1
        parts = []
        while length > 0:
            if file_index in self._unverified:
                verify_shard(self.files[file_index], self._unverified.pop(file_index))
            tokens = self._arrays[file_index]
            offset = start - int(self._starts[file_index])
            take = min(length, len(tokens) - offset)
            parts.append(tokens[offset:offset + take])
            start, length, file_index = start + take, length - take, file_index + 1
        return np.concatenate(parts).astype(np.int64)


class ShuffledOrder:
    """Global sample index -> window index; epoch e is a permutation drawn from (seed, e)."""

    def __init__(self, *, n_windows: int, seed: int):
        self.n_windows = n_windows
        self.seed = seed
        self._permutations: dict[int, np.ndarray] = {}

    def window_indices(self, positions: np.ndarray) -> np.ndarray:
        epochs, offsets = np.divmod(positions, self.n_windows)
        result = np.empty_like(positions)
        for epoch in np.unique(epochs):
            in_epoch = epochs == epoch
            result[in_epoch] = self._permutation(int(epoch))[offsets[in_epoch]]
        return result

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            if len(self._permutations) >= 2:  # a batch spans at most two epochs in practice
                self._permutations.pop(min(self._permutations))
            rng = np.random.default_rng((self.seed, epoch))
            self._permutations[epoch] = rng.permutation(self.n_windows)
        return self._permutations[epoch]


def check_token_ids(windows: np.ndarray, *, vocab_size: int | None,
                    files: Sequence[str]) -> np.ndarray:
    if windows.size and int(windows.min()) < 0:  # signed token files (int32, int64)
        raise ValueError(f"token id {int(windows.min())} in {files[0]}, ... is negative: "
                         "check data.dtype")
    if vocab_size is not None and windows.size and int(windows.max()) >= vocab_size:
        raise ValueError(f"token id {int(windows.max())} in {files[0]}, ... is >= vocab_size "
                         f"{vocab_size}: raise model.vocab_size or check data.dtype")
    return windows
