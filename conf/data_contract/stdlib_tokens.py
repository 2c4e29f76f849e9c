"""The prepared stdlib corpus, as both sides see it: the launcher builds it
(`launcher.data.stdlib_corpus`), the ranks read its token files (`training.data`)."""
from __future__ import annotations

STDLIB_TOKEN_DTYPE = "uint8"
"""Element type of the corpus's train.bin/val.bin: one token per byte."""
STDLIB_VOCAB_SIZE = 256
"""Byte-level: token id = byte value."""
