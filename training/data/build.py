"""The batch streams a DataSpec asks for: synthetic tokens, token files (stdlib or data=files),
a mixture of prepared dirs, or packed SFT conversations; training and validation."""
from __future__ import annotations

from collections.abc import Sequence

from conf.data_contract.prepared_corpus import is_sft, read_manifest, shard_checksums
from conf.data_contract.stdlib_tokens import STDLIB_TOKEN_DTYPE
from conf.schema import DataKind
from conf.spec import DataSpec, TrainingSpec
from training.data.batches import (SyntheticBatches, TrainBatches, ValBatches,
                                   synthetic_val_batches, val_batches)
from training.data.mixture import MixtureBatches
from training.data.sft_batches import SftTrainBatches, sft_val_batches


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
        return MixtureBatches(sources=data.sources, weights=data.weights,
                              vocab_size=data.vocab_size, **common)
    if is_sft_data(data):
        return SftTrainBatches(prepared=data.prepared, vocab_size=data.vocab_size, **common)
    return TrainBatches(files=_required(data.train_files, "train_files"),
                        dtype=token_dtype(data), vocab_size=data.vocab_size,
                        checksums=prepared_checksums(data), **common)


def build_val_batches(data: DataSpec, training: TrainingSpec, *, dp_rank: int,
                      dp_size: int) -> ValBatches:
    """training.eval_batches validation micro-batches per dp rank, fixed across evaluations."""
    common = dict(seq_len=training.seq_len, micro_batch_size=training.micro_batch_size,
                  n_batches=training.eval_batches, dp_rank=dp_rank, dp_size=dp_size)
    if data.kind is DataKind.synthetic:
        return synthetic_val_batches(vocab_size=data.vocab_size, seed=training.seed, **common)
    if is_sft_data(data):
        return sft_val_batches(prepared=data.prepared, vocab_size=data.vocab_size, **common)
    return val_batches(files=_required(data.val_files, "val_files"), dtype=token_dtype(data),
                       vocab_size=data.vocab_size, checksums=prepared_checksums(data), **common)


def prepared_checksums(data: DataSpec) -> dict[str, str] | None:
    """Shard path -> sha256 of data.prepared's manifest (None without one): every shard a rank
    opens is verified against it."""
    return shard_checksums(data.prepared, read_manifest(data.prepared)) if data.prepared \
        else None


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
