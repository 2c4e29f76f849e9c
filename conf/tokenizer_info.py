"""What meshrun needs to know about a Hugging Face `tokenizer.json`, read as plain JSON.

resolve() checks model.vocab_size against a tokenizer and a prepared corpus against the
tokenizer it was made with, without importing the `tokenizers` library: the vocab size (highest
id + 1 over the model's vocab and the added tokens), the special tokens (BOS, EOS, pad), and a
sha256 of the file that names this exact tokenizer.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
"""The file a Hugging Face tokenizer dir holds; `data.tokenizer` may name it or its folder."""
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
"""Tried in order when no BOS token is named (tokenizer_config.json's bos_token comes first)."""
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]")
"""Tried in order when no EOS token is named (tokenizer_config.json's eos_token comes first)."""
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenizerInfo:
    path: str
    """The tokenizer.json file, absolute."""
    sha256: str
    vocab_size: int
    """Highest token id + 1: the smallest model.vocab_size that can embed every id."""
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None


def tokenizer_file(path: str | Path) -> Path:
    """`path` itself, or the tokenizer.json inside it when it is a folder."""
    p = Path(path).expanduser()
    return p / TOKENIZER_FILE if p.is_dir() else p


def read_tokenizer_info(path: str | Path, *, bos_token: str = "", eos_token: str = "",
                        pad_token: str = "") -> TokenizerInfo:
    """The facts above; ValueError (with the reason) for a missing or unreadable file, or a
    named special token the tokenizer does not have."""
    file = tokenizer_file(path)
    if not file.is_file():
        raise ValueError(f"no {TOKENIZER_FILE} at {file}")
    raw = file.read_bytes()
    try:
        data = json.loads(raw)
        vocab = _vocab(data)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{file} is not a Hugging Face tokenizer.json ({err})") from None
    config = _tokenizer_config(file.parent)
    ids = {name: _special_id(vocab, wanted, config.get(key), names, key)
           for name, wanted, key, names in (("bos_id", bos_token, "bos_token", BOS_NAMES),
                                            ("eos_id", eos_token, "eos_token", EOS_NAMES),
                                            ("pad_id", pad_token, "pad_token", PAD_NAMES))}
    return TokenizerInfo(path=str(file.resolve()), sha256=hashlib.sha256(raw).hexdigest(),
                         vocab_size=max(vocab.values()) + 1, **ids)


def _vocab(data: dict) -> dict[str, int]:
    """token -> id over the model's vocab (dict for BPE/WordPiece/WordLevel, list for Unigram)
    and the added tokens."""
    model_vocab = data["model"]["vocab"]
    if isinstance(model_vocab, list):
        vocab = {entry[0]: i for i, entry in enumerate(model_vocab)}
    else:
        vocab = {str(token): int(i) for token, i in model_vocab.items()}
    for added in data.get("added_tokens") or []:
        vocab[added["content"]] = int(added["id"])
    if not vocab:
        raise ValueError("its vocabulary is empty")
    return vocab


def _tokenizer_config(folder: Path) -> dict:
    """bos/eos/pad token names from a tokenizer_config.json beside the file, if any."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):  # an AddedToken written out: {"content": ...}
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _special_id(vocab: dict[str, int], wanted: str, configured: str | None,
                names: tuple[str, ...], key: str) -> int | None:
    if wanted:
        if wanted not in vocab:
            raise ValueError(f"{key} {wanted!r} is not in the tokenizer's vocabulary")
        return vocab[wanted]
    for name in ((configured,) if configured else ()) + names:
        if name in vocab:
            return vocab[name]
    return None
