"""Tokenizers for meshrun data: load one, train a BPE on local text.

A tokenizer is a Hugging Face `tokenizer.json` (the `tokenizers` library), or a tiktoken BPE
rank file (`*.tiktoken`, Llama 3's `tokenizer.model`; the optional `tiktoken` library), or a
folder holding one, as a Hugging Face model dir does. Special token ids come from
conf.data_contract.tokenizer_info (shared with resolve()), so the launcher, the manifest and
the pre-launch checks agree on them. Byte-level data (data=stdlib) needs none of this.
"""
from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conf.data_contract.tokenizer_info import (TOKENIZER_FILE, TokenizerInfo, read_tokenizer_info,
                                               tokenizer_file)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
"""How Llama 3 (and tiktoken's cl100k_base) splits text before the BPE merges."""
TRAINED_SPECIALS = ("<s>", "</s>", "<pad>")
"""BOS, EOS and pad of a tokenizer made by `meshrun data train-tokenizer` (ids 0, 1, 2)."""


def import_tokenizers():
    """The `tokenizers` module, or ValueError saying how to get it."""
    try:
        import tokenizers
    except ImportError:
        raise ValueError("the `tokenizers` package is not installed (fix: pip install "
                         "tokenizers; it comes with transformers)") from None
    return tokenizers


def import_tiktoken():
    """The `tiktoken` module, or ValueError saying how to get it."""
    try:
        import tiktoken
    except ImportError:
        raise ValueError("a tiktoken rank file needs the `tiktoken` package, which is not "
                         "installed (fix: pip install 'meshrun[tiktoken]', or pip install "
                         "tiktoken)") from None
    return tiktoken


def load_backend(info: TokenizerInfo):
    """The library's tokenizer for `info`: tokenizers.Tokenizer, or tiktoken.Encoding."""
    if info.kind != "tiktoken":
        return import_tokenizers().Tokenizer.from_file(info.path)
    tiktoken = import_tiktoken()
    raw = Path(info.path).read_bytes()  # not tiktoken's loader: it caches by path, in /tmp
    pairs = raw.split()
    ranks = {base64.b64decode(token): int(rank) for token, rank in zip(pairs[::2], pairs[1::2])}
    first_special = info.vocab_size - len(info.specials)
    return tiktoken.Encoding(name=Path(info.path).name, pat_str=LLAMA3_PATTERN,
                             mergeable_ranks=ranks,
                             special_tokens={name: first_special + i
                                             for i, name in enumerate(info.specials)})


def encode_batch(backend, texts: Sequence[str], *, kind: str,
                 special_text: bool = False) -> list[list[int]]:
    """Ids of each text alone: no BOS/EOS added; with tiktoken, special-token text is
    ordinary text (a document cannot end itself by quoting `<|end_of_text|>`) unless
    `special_text` (a chat template's rendering, whose markers are special tokens)."""
    if kind == "tiktoken":
        if special_text:
            return backend.encode_batch(list(texts), allowed_special="all")
        return backend.encode_ordinary_batch(list(texts))
    return [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer and its facts (vocab size, special ids, file hash)."""

    info: TokenizerInfo
    backend: object
    """tokenizers.Tokenizer, or tiktoken.Encoding (info.kind == "tiktoken")."""

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    def encode(self, text: str) -> list[int]:
        """Ids of `text` alone: no BOS/EOS added (documents get those in `data prepare`)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str], *, special_text: bool = False
                     ) -> list[list[int]]:
        return encode_batch(self.backend, texts, kind=self.info.kind, special_text=special_text)

    def special_ids(self) -> list[int]:
        """Ids of the tokenizer's special tokens, ascending."""
        if self.info.kind == "tiktoken":
            first = self.vocab_size - len(self.info.specials)
            return list(range(first, self.vocab_size))
        return sorted(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def token_text(self, token_id: int) -> str:
        """One token as the tokenizer writes it (a special token's name)."""
        if self.info.kind == "tiktoken":
            first = self.vocab_size - len(self.info.specials)
            if token_id >= first:
                return self.info.specials[token_id - first]
            return self.backend.decode_single_token_bytes(token_id).decode("utf-8", "replace")
        return self.backend.id_to_token(token_id)

    def decode(self, ids: Sequence[int]) -> str:
        if self.info.kind == "tiktoken":
            return self.backend.decode(list(ids))
        return self.backend.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str | Path, *, bos_token: str = "", eos_token: str = "",
                   pad_token: str = "") -> Tokenizer:
    """ValueError with the reason for a missing, unreadable or inconsistent tokenizer."""
    info = read_tokenizer_info(path, bos_token=bos_token, eos_token=eos_token,
                               pad_token=pad_token)
    return Tokenizer(info=info, backend=load_backend(info))


def train_bpe(files: Sequence[str | Path], *, vocab_size: int, out_dir: str | Path,
              min_frequency: int = 2) -> Path:
    """Train a byte-level BPE (GPT-2 style: every byte has a token, so any text round-trips) on
    local text files; write out_dir/tokenizer.json (+ tokenizer_config.json naming BOS/EOS/pad,
    which transformers' AutoTokenizer reads too). Returns the tokenizer.json path."""
    tk = import_tokenizers()
    missing = [str(f) for f in files if not Path(f).is_file()]
    if missing:
        raise ValueError(f"not a file: {', '.join(missing)}")
    floor = 256 + len(TRAINED_SPECIALS)
    if vocab_size < floor:
        raise ValueError(f"--vocab-size={vocab_size}: a byte-level BPE needs at least {floor} "
                         f"(256 bytes + {len(TRAINED_SPECIALS)} special tokens)")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=list(TRAINED_SPECIALS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(f) for f in files], trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / TOKENIZER_FILE))
    bos, eos, pad = TRAINED_SPECIALS
    (out / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", '
        f'"bos_token": "{bos}", "eos_token": "{eos}", "pad_token": "{pad}"}}\n')
    return tokenizer_file(out)
