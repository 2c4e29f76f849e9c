"""Text -> token ids for the scorer: the run's tokenizer (data.tokenizer), else byte-level."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from conf.data_contract.tokenizer_info import tokenizer_file

Encoder = Callable[[str], list[int]]


def byte_encoder(text: str) -> list[int]:
    """Byte-level data (data=stdlib, no tokenizer): each UTF-8 byte is a token."""
    return list(text.encode("utf-8"))


def build_encoder(tokenizer: str) -> Encoder:
    """The encoder of `tokenizer` (a tokenizer.json or a folder holding one); byte-level when
    empty. A tiktoken rank file is refused (ValueError): not supported here yet."""
    if not tokenizer:
        return byte_encoder
    path = tokenizer_file(tokenizer)
    if Path(path).suffix != ".json":
        raise ValueError(f"{path}: eval tasks need a Hugging Face tokenizer.json "
                         "(tiktoken rank files are not supported by the scorer yet)")
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(path))
    return lambda text: backend.encode(text, add_special_tokens=False).ids
