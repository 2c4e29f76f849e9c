"""What meshrun needs to know about a tokenizer file, read as plain text.

resolve() checks model.vocab_size against a tokenizer and a prepared corpus against the
tokenizer it was made with, without importing a tokenizer library: the vocab size, the special
tokens (BOS, EOS, pad), and a sha256 of the file that names this exact tokenizer. Two kinds:

- "tokenizers": a Hugging Face `tokenizer.json` (vocab size = highest id + 1 over the model's
  vocab and the added tokens);
- "tiktoken": a tiktoken BPE rank file (`*.tiktoken`, or Llama 3's `tokenizer.model`): one
  `base64(token bytes) rank` per line. As in Llama 3, the LLAMA3_SPECIALS follow the ranks
  (vocab size = ranks + 256), and the text is split with Llama 3's pattern.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
"""The file a Hugging Face tokenizer dir holds; `data.tokenizer` may name it or its folder."""
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
"""Tried in order when no BOS token is named (tokenizer_config.json's bos_token comes first)."""
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]")
"""Tried in order when no EOS token is named (tokenizer_config.json's eos_token comes first)."""
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")
TIKTOKEN_SUFFIX = ".tiktoken"
TIKTOKEN_MODEL = "tokenizer.model"
"""Llama 3's name for its rank file (SentencePiece uses the same name for a binary file)."""
LLAMA3_NAMED_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                         "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                         "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                         "<|eot_id|>", "<|python_tag|>")
LLAMA3_SPECIALS = LLAMA3_NAMED_SPECIALS + tuple(
    f"<|reserved_special_token_{i}|>" for i in range(2, 2 + 256 - len(LLAMA3_NAMED_SPECIALS)))
"""The 256 special tokens of a tiktoken rank file, ids from (highest rank + 1) on, in this
order (Llama 3.1's tokenizer: 128000 BOS, 128001 EOS, 128004 pad, 128009 eot)."""
_RANK_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2} [0-9]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenizerInfo:
    path: str
    """The tokenizer file (tokenizer.json, or a tiktoken rank file), absolute."""
    sha256: str
    vocab_size: int
    """Highest token id + 1: the smallest model.vocab_size that can embed every id."""
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    kind: str = "tokenizers"
    """"tokenizers" (a tokenizer.json) or "tiktoken" (a rank file)."""
    specials: tuple[str, ...] = ()
    """tiktoken: the special tokens, ids vocab_size - len(specials) on."""


def tokenizer_file(path: str | Path) -> Path:
    """`path` itself, or the tokenizer inside it when it is a folder: its tokenizer.json, else
    a tiktoken rank file (tokenizer.model, or the one *.tiktoken file)."""
    p = Path(path).expanduser()
    if not p.is_dir() or (p / TOKENIZER_FILE).is_file():
        return p / TOKENIZER_FILE if p.is_dir() else p
    ranks = [f for f in sorted(p.glob(f"*{TIKTOKEN_SUFFIX}")) if f.is_file()]
    if (p / TIKTOKEN_MODEL).is_file() and is_tiktoken_file(p / TIKTOKEN_MODEL):
        ranks = [p / TIKTOKEN_MODEL]
    return ranks[0] if len(ranks) == 1 else p / TOKENIZER_FILE


def is_tiktoken_file(file: Path) -> bool:
    """A *.tiktoken file, or a file whose first line is a `base64 rank` pair."""
    if file.suffix == TIKTOKEN_SUFFIX:
        return True
    try:
        with open(file, "rb") as handle:
            first = handle.readline(4096).rstrip(b"\r\n")
    except OSError:
        return False
    return bool(_RANK_LINE.fullmatch(first))


def read_tokenizer_info(path: str | Path, *, bos_token: str = "", eos_token: str = "",
                        pad_token: str = "") -> TokenizerInfo:
    """The facts above; ValueError (with the reason) for a missing or unreadable file, or a
    named special token the tokenizer does not have."""
    file = tokenizer_file(path)
    if not file.is_file():
        raise ValueError(f"no {TOKENIZER_FILE} at {file} (nor a tiktoken {TIKTOKEN_MODEL} "
                         f"or *{TIKTOKEN_SUFFIX} file)")
    raw = file.read_bytes()
    if is_tiktoken_file(file):
        return _tiktoken_info(file, raw, bos_token=bos_token, eos_token=eos_token,
                              pad_token=pad_token)
    try:
        data = json.loads(raw)
        vocab = _vocab(data)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{file} is not a Hugging Face tokenizer.json ({err})") from None
    ids = _special_ids(vocab, file.parent, bos_token=bos_token, eos_token=eos_token,
                       pad_token=pad_token)
    return TokenizerInfo(path=str(file.resolve()), sha256=hashlib.sha256(raw).hexdigest(),
                         vocab_size=max(vocab.values()) + 1, **ids)


def _special_ids(vocab: dict, directory: Path, *, bos_token: str, eos_token: str,
                 pad_token: str) -> dict:
    """bos_id / eos_id / pad_id: the token asked for, else tokenizer_config.json's, else the
    first of the usual names found in `vocab` (name -> id)."""
    config = _tokenizer_config(directory)
    return {name: _special_id(vocab, wanted, config.get(key), names, key)
            for name, wanted, key, names in (("bos_id", bos_token, "bos_token", BOS_NAMES),
                                             ("eos_id", eos_token, "eos_token", EOS_NAMES),
                                             ("pad_id", pad_token, "pad_token", PAD_NAMES))}


def _tiktoken_info(file: Path, raw: bytes, *, bos_token: str, eos_token: str,
                   pad_token: str) -> TokenizerInfo:
    n_ranks = count_ranks(raw, file)
    specials = {name: n_ranks + i for i, name in enumerate(LLAMA3_SPECIALS)}
    ids = _special_ids(specials, file.parent, bos_token=bos_token, eos_token=eos_token,
                       pad_token=pad_token)
    return TokenizerInfo(path=str(file.resolve()), sha256=hashlib.sha256(raw).hexdigest(),
                         vocab_size=n_ranks + len(LLAMA3_SPECIALS), kind="tiktoken",
                         specials=LLAMA3_SPECIALS, **ids)


def count_ranks(raw: bytes, file: Path) -> int:
    """The number of ranks of a tiktoken file: they must be 0, 1, ..., n-1, one per line."""
    lines = raw.split()
    if len(lines) % 2 or not lines:
        raise ValueError(f"{file} is not a tiktoken rank file (lines of `base64 rank`)")
    ranks = sorted(int(r) for r in lines[1::2] if r.isdigit())
    if ranks != list(range(len(lines) // 2)):
        raise ValueError(f"{file}: the ranks of a tiktoken file must be 0..n-1, each once")
    return len(ranks)


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
