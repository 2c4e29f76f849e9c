"""Rank-side data: memory-mapped token files cut into samples, seeded order, sharded by dp rank.

A sample is a non-overlapping window of seq_len+1 tokens over the token files concatenated
logically (input = window[:-1], target = window[1:]). Epoch e visits every window once, in a
permutation drawn from (seed, e). The unit of position is the GLOBAL sample index (samples consumed
by all data-parallel ranks together), so the order, and a resume, do not depend on the dp degree:
a step takes the global batch [position, position + global_batch_size), data-parallel rank r takes
its contiguous slice of global_batch_size/dp samples and cuts it into grad_accum_steps
micro-batches. Ranks that differ only in tp/pp/cp coordinates share a dp rank and get the same data.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from conf.schema import DataKind
from conf.data_contract.stdlib_corpus import STDLIB_TOKEN_DTYPE
from conf.data_contract.prepared_corpus import is_sft, read_manifest
from conf.spec import TOKEN_DTYPES, DataSpec, TrainingSpec

MicroBatch = tuple[torch.Tensor, torch.Tensor]
"""(inputs, targets), both int64 [micro_batch_size, seq_len]."""


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
    """Non-overlapping windows of seq_len+1 tokens over token files concatenated in order."""

    def __init__(self, files: Sequence[str], *, dtype: str, seq_len: int):
        if not files:
            raise ValueError("no token files given")
        self.files = tuple(files)
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


def rank_micro_batch_positions(*, position: int, global_batch_size: int, micro_batch_size: int,
                               grad_accum_steps: int, dp_rank: int,
                               dp_size: int) -> list[np.ndarray]:
    """Global sample indices of this dp rank's micro-batches for the step starting at `position`."""
    first = position + dp_rank * (global_batch_size // dp_size)
    return [first + i * micro_batch_size + np.arange(micro_batch_size, dtype=np.int64)
            for i in range(grad_accum_steps)]


def check_batch_layout(*, global_batch_size: int, micro_batch_size: int, grad_accum_steps: int,
                       dp_rank: int, dp_size: int) -> None:
    """ValueError unless micro x accumulation x dp == global batch and 0 <= dp_rank < dp_size."""
    if micro_batch_size * grad_accum_steps * dp_size != global_batch_size:
        raise ValueError(f"micro_batch_size({micro_batch_size}) x grad_accum_steps"
                         f"({grad_accum_steps}) x dp({dp_size}) != global_batch_size"
                         f"({global_batch_size})")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} outside 0..{dp_size - 1}")


def to_micro_batch(windows: np.ndarray) -> MicroBatch:
    tokens = torch.from_numpy(windows)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class _StepBatches:
    """Stepping, sharding and resume shared by file-backed and synthetic training batches."""

    kind = ""

    def __init__(self, *, seq_len: int, seed: int, global_batch_size: int, micro_batch_size: int,
                 grad_accum_steps: int, dp_rank: int, dp_size: int):
        check_batch_layout(global_batch_size=global_batch_size, micro_batch_size=micro_batch_size,
                           grad_accum_steps=grad_accum_steps, dp_rank=dp_rank, dp_size=dp_size)
        self.seq_len, self.seed = seq_len, seed
        self.global_batch_size = global_batch_size
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.position = 0
        """Global samples consumed so far (by all dp ranks together)."""

    @property
    def tokens_seen(self) -> int:
        """Training tokens consumed by all ranks together (targets, seq_len per sample)."""
        return self.position * self.seq_len

    def next_step(self) -> list[MicroBatch]:
        """This rank's grad_accum_steps micro-batches for the next step; advances the position."""
        positions = rank_micro_batch_positions(
            position=self.position, global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size, grad_accum_steps=self.grad_accum_steps,
            dp_rank=self.dp_rank, dp_size=self.dp_size)
        self.position += self.global_batch_size
        return [self._micro_batch(p) for p in positions]

    def state_dict(self) -> dict:
        return {"position": self.position, "kind": self.kind, "seed": self.seed,
                "seq_len": self.seq_len, "samples_per_epoch": self._samples_per_epoch()}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the saved step; any dp degree may load any saved state."""
        mismatches = [f"{key}: saved {state.get(key)!r}, now {value!r}"
                      for key, value in self.state_dict().items()
                      if key != "position" and state.get(key) != value]
        if mismatches:
            raise ValueError("cannot resume the data order (" + "; ".join(mismatches) + "): "
                             "resume with the same data, seq_len and seed, or start a new run")
        self.position = int(state["position"])

    def _micro_batch(self, positions: np.ndarray) -> MicroBatch:
        return to_micro_batch(self._samples(positions))

    def _samples(self, positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _samples_per_epoch(self) -> int:
        return 0


class TrainBatches(_StepBatches):
    """Training micro-batches from token files, in the seeded epoch-wise shuffled order."""

    kind = "files"

    def __init__(self, *, files: Sequence[str], dtype: str, seq_len: int, seed: int,
                 global_batch_size: int, micro_batch_size: int, grad_accum_steps: int,
                 dp_rank: int, dp_size: int, vocab_size: int | None = None):
        super().__init__(seq_len=seq_len, seed=seed, global_batch_size=global_batch_size,
                         micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                         dp_rank=dp_rank, dp_size=dp_size)
        self.dataset = TokenDataset(files, dtype=dtype, seq_len=seq_len)
        self.order = ShuffledOrder(n_windows=self.dataset.n_windows, seed=seed)
        self.vocab_size = vocab_size

    @property
    def epoch(self) -> float:
        """Fractional epochs completed."""
        return self.position / self.dataset.n_windows

    def _samples(self, positions: np.ndarray) -> np.ndarray:
        windows = self.dataset.windows(self.order.window_indices(positions))
        return check_token_ids(windows, vocab_size=self.vocab_size, files=self.dataset.files)

    def _samples_per_epoch(self) -> int:
        return self.dataset.n_windows


class SyntheticBatches(_StepBatches):
    """Uniform random tokens; sample g is drawn from (seed, stream, g), so it is resumable.

    Nothing to learn: the loss floor is ln(vocab_size). For throughput and plumbing checks.
    """

    kind = "synthetic"

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, global_batch_size: int,
                 micro_batch_size: int, grad_accum_steps: int, dp_rank: int, dp_size: int):
        super().__init__(seq_len=seq_len, seed=seed, global_batch_size=global_batch_size,
                         micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                         dp_rank=dp_rank, dp_size=dp_size)
        self.vocab_size = vocab_size

    def _samples(self, positions: np.ndarray) -> np.ndarray:
        return synthetic_samples(positions, vocab_size=self.vocab_size, seq_len=self.seq_len,
                                 seed=self.seed, stream=0)


def synthetic_samples(positions: np.ndarray, *, vocab_size: int, seq_len: int, seed: int,
                      stream: int) -> np.ndarray:
    """int64 [len(positions), seq_len+1] of uniform tokens; stream 0 = train, 1 = validation."""
    return np.stack([np.random.default_rng((seed, stream, int(p))).integers(0, vocab_size,
                                                                            seq_len + 1)
                     for p in positions])


def check_token_ids(windows: np.ndarray, *, vocab_size: int | None,
                    files: Sequence[str]) -> np.ndarray:
    if windows.size and int(windows.min()) < 0:  # signed token files (int32, int64)
        raise ValueError(f"token id {int(windows.min())} in {files[0]}, ... is negative: "
                         "check data.dtype")
    if vocab_size is not None and windows.size and int(windows.max()) >= vocab_size:
        raise ValueError(f"token id {int(windows.max())} in {files[0]}, ... is >= vocab_size "
                         f"{vocab_size}: raise model.vocab_size or check data.dtype")
    return windows


class ValBatches:
    """A fixed set of validation micro-batches for one dp rank: the same on every iteration.

    Micro-batch i of dp rank r holds validation samples (i*dp + r)*mb ... +mb, taken in file order
    and wrapped around (cycled) when the validation set is smaller than requested.
    """

    def __init__(self, *, samples: Callable[[np.ndarray], np.ndarray], n_samples: int | None,
                 micro_batch_size: int, n_batches: int, dp_rank: int, dp_size: int):
        self._samples, self._n_samples = samples, n_samples
        self.micro_batch_size, self.n_batches = micro_batch_size, n_batches
        self.dp_rank, self.dp_size = dp_rank, dp_size

    @property
    def n_distinct_samples(self) -> int:
        """Distinct samples one evaluation sees over all dp ranks together."""
        requested = self.n_batches * self.dp_size * self.micro_batch_size
        return requested if self._n_samples is None else min(requested, self._n_samples)

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[MicroBatch]:
        for i in range(self.n_batches):
            first = (i * self.dp_size + self.dp_rank) * self.micro_batch_size
            positions = first + np.arange(self.micro_batch_size, dtype=np.int64)
            if self._n_samples is not None:
                positions %= self._n_samples
            yield self._micro_batch(positions)

    def _micro_batch(self, positions: np.ndarray) -> MicroBatch:
        return to_micro_batch(self._samples(positions))


def val_batches(*, files: Sequence[str], dtype: str, seq_len: int, micro_batch_size: int,
                n_batches: int, dp_rank: int, dp_size: int,
                vocab_size: int | None = None) -> ValBatches:
    """Validation micro-batches from token files (unshuffled, sharded by dp rank)."""
    dataset = TokenDataset(files, dtype=dtype, seq_len=seq_len)
    return ValBatches(
        samples=lambda idx: check_token_ids(dataset.windows(idx), vocab_size=vocab_size,
                                            files=dataset.files),
        n_samples=dataset.n_windows, micro_batch_size=micro_batch_size, n_batches=n_batches,
        dp_rank=dp_rank, dp_size=dp_size)


def synthetic_val_batches(*, vocab_size: int, seq_len: int, seed: int, micro_batch_size: int,
                          n_batches: int, dp_rank: int, dp_size: int) -> ValBatches:
    """Validation micro-batches of random tokens, a stream disjoint from training's."""
    return ValBatches(
        samples=lambda idx: synthetic_samples(idx, vocab_size=vocab_size, seq_len=seq_len,
                                              seed=seed, stream=1),
        n_samples=None, micro_batch_size=micro_batch_size, n_batches=n_batches,
        dp_rank=dp_rank, dp_size=dp_size)


def build_train_batches(data: DataSpec, training: TrainingSpec, *, dp_rank: int,
                        dp_size: int) -> TrainBatches | SyntheticBatches:
    """The training batches `data.kind` asks for; stdlib and files read data.train_files."""
    common = dict(seq_len=training.seq_len, seed=training.seed,
                  global_batch_size=training.global_batch_size,
                  micro_batch_size=training.micro_batch_size,
                  grad_accum_steps=training.grad_accum_steps, dp_rank=dp_rank, dp_size=dp_size)
    if data.kind is DataKind.synthetic:
        return SyntheticBatches(vocab_size=data.vocab_size, **common)
    if data.sources:
        from training.data.mixture import MixtureBatches

        return MixtureBatches(sources=data.sources, weights=data.weights,
                              vocab_size=data.vocab_size, **common)
    if is_sft_data(data):
        from training.data.sft_batches import SftTrainBatches

        return SftTrainBatches(prepared=data.prepared, vocab_size=data.vocab_size, **common)
    return TrainBatches(files=_required(data.train_files, "train_files"),
                        dtype=token_dtype(data), vocab_size=data.vocab_size, **common)


def build_val_batches(data: DataSpec, training: TrainingSpec, *, dp_rank: int,
                      dp_size: int) -> ValBatches:
    """training.eval_batches validation micro-batches per dp rank, fixed across evaluations."""
    common = dict(seq_len=training.seq_len, micro_batch_size=training.micro_batch_size,
                  n_batches=training.eval_batches, dp_rank=dp_rank, dp_size=dp_size)
    if data.kind is DataKind.synthetic:
        return synthetic_val_batches(vocab_size=data.vocab_size, seed=training.seed, **common)
    if is_sft_data(data):
        from training.data.sft_batches import sft_val_batches

        return sft_val_batches(prepared=data.prepared, vocab_size=data.vocab_size, **common)
    return val_batches(files=_required(data.val_files, "val_files"), dtype=token_dtype(data),
                       vocab_size=data.vocab_size, **common)


def is_sft_data(data: DataSpec) -> bool:
    """data.prepared is packed chat data with a loss mask (`meshrun data prepare-sft`)."""
    return bool(data.prepared) and is_sft(read_manifest(data.prepared))


def token_dtype(data: DataSpec) -> str:
    """Element type of raw token files: uint8 for the stdlib corpus, else data.dtype."""
    return STDLIB_TOKEN_DTYPE if data.kind is DataKind.stdlib else data.dtype


def _required(files: Sequence[str], field: str) -> tuple[str, ...]:
    if not files:
        raise ValueError(f"data.{field} is empty: the launcher fills it for stdlib data; "
                         f"for files data, set data.{field} to a path or glob of token files")
    return tuple(files)
