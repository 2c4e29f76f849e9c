"""Hugging Face `tokenizers` tokenizers for meshrun data: load one, train a BPE on local text.

A tokenizer is a `tokenizer.json` (or a folder holding one, as a Hugging Face model dir does).
Special token ids come from conf.tokenizer_info (shared with resolve()), so the launcher, the
manifest and the pre-launch checks agree on them. Byte-level data (data=stdlib) needs none of this.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conf.tokenizer_info import TOKENIZER_FILE, TokenizerInfo, read_tokenizer_info, tokenizer_file

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


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer and its facts (vocab size, special ids, file hash)."""

    info: TokenizerInfo
    backend: object
    """tokenizers.Tokenizer"""

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    def encode(self, text: str) -> list[int]:
        """Ids of `text` alone: no BOS/EOS added (documents get those in `data prepare`)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str | Path, *, bos_token: str = "", eos_token: str = "",
                   pad_token: str = "") -> Tokenizer:
    """ValueError with the reason for a missing, unreadable or inconsistent tokenizer."""
    info = read_tokenizer_info(path, bos_token=bos_token, eos_token=eos_token,
                               pad_token=pad_token)
    tokenizers = import_tokenizers()
    backend = tokenizers.Tokenizer.from_file(info.path)
    return Tokenizer(info=info, backend=backend)


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
