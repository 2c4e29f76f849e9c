"""model.vocab_size from the data when the user did not give it: the tokenizer a prepared
corpus was made with (its manifest records the vocab size), else data.tokenizer itself.

Inferred, still checked: the value is the tokenizer's vocab size (highest id + 1), rounded up
to a multiple of parallel.tp so the embedding and output head split evenly (Megatron pads its
vocabulary the same way). A value the user gives on the command line is never replaced; one
below the tokenizer's is refused by the data rules as before (prepared_corpus.py). A model
whose shape comes from model.path (config.json) keeps its own.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, replace

from conf.data_contract.prepared_corpus import read_manifest
from conf.data_contract.tokenizer_info import read_tokenizer_info
from conf.schema import DataConfig, DataKind
from conf.spec import ModelSpec

VOCAB_KEY = "model.vocab_size"


@dataclass(frozen=True, slots=True, kw_only=True)
class DataVocab:
    vocab_size: int
    source: str
    """Where it was read, in words: "the manifest of DIR" or "the tokenizer FILE"."""


def data_vocab(d: DataConfig) -> DataVocab | None:
    """The vocab size the data's tokenizer has: data.prepared's manifest (or the first of
    data.sources'), else data.tokenizer; None when none is given or readable (an unreadable
    one is reported by the data rules)."""
    if d.kind is not DataKind.files:
        return None
    for folder in [d.prepared] if d.prepared else list(d.sources[:1]):
        try:
            size = read_manifest(folder)["tokenizer"]["vocab_size"]
        except (ValueError, KeyError, TypeError):
            return None
        return DataVocab(vocab_size=size, source=f"the manifest of {folder}") \
            if isinstance(size, int) and size > 0 else None
    if d.tokenizer:
        try:
            info = read_tokenizer_info(d.tokenizer)
        except (ValueError, OSError):
            return None
        return DataVocab(vocab_size=info.vocab_size, source=f"the tokenizer {info.path}")
    return None


def with_data_vocab(model: ModelSpec, d: DataConfig, *, explicit: Collection[str],
                    tp: int) -> ModelSpec:
    """`model` with vocab_size from the data (module docstring), when the user gave none."""
    if VOCAB_KEY in explicit or model.path:
        return model
    found = data_vocab(d)
    if found is None:
        return model
    return replace(model, vocab_size=padded_vocab(found.vocab_size, tp))


def padded_vocab(vocab_size: int, tp: int) -> int:
    """`vocab_size` rounded up to a multiple of `tp` (tp < 1: unchanged; reported elsewhere)."""
    return math.ceil(vocab_size / tp) * tp if tp >= 1 else vocab_size
