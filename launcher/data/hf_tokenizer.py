"""Tokenizers for meshrun data: load one, train a BPE on local text.

A tokenizer is a Hugging Face `tokenizer.json` (the `tokenizers` library), or a tiktoken BPE
rank file (`*.tiktoken`, Llama 3's `tokenizer.model`; the optional `tiktoken` library), or a
folder holding one, as a Hugging Face model dir does. Special token ids come from
conf.data_contract.tokenizer_info (shared with resolve()), so the launcher, the manifest and
the pre-launch checks agree on them. Byte-level data (data=stdlib) needs none of this.
"""
from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conf.data_contract.tokenizer_info import (TOKENIZER_FILE, TokenizerInfo, read_tokenizer_info,
                                               tokenizer_file)
from launcher.data.document_inputs import expand_inputs, hash_and_check
from launcher.data.output_dir import check_out_dir, os_problem, staged_dir

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
"""How Llama 3 (and tiktoken's cl100k_base) splits text before the BPE merges."""
TRAINED_SPECIALS = ("<s>", "</s>", "<pad>")
"""BOS, EOS and pad of a tokenizer made by `meshrun data train-tokenizer` (ids 0, 1, 2)."""
MAX_VOCAB_SIZE = 1 << 22
"""--vocab-size above this is refused (the tokenizers library preallocates per entry and aborts
the process near 2**30)."""
TRAIN_COMMAND = "data train-tokenizer"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_NAMES = (TOKENIZER_FILE, TOKENIZER_CONFIG)
TRAINED_CONFIG = ('{"tokenizer_class": "PreTrainedTokenizerFast", '
                  f'"bos_token": "{TRAINED_SPECIALS[0]}", "eos_token": "{TRAINED_SPECIALS[1]}", '
                  f'"pad_token": "{TRAINED_SPECIALS[2]}"}}\n')


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
    """Ids of each text alone: no BOS/EOS added; with either backend, special-token text is
    ordinary text (a document cannot end itself by quoting `<|end_of_text|>`) unless
    `special_text` (a chat template's rendering, whose markers are special tokens)."""
    if kind == "tiktoken":
        if special_text:
            return backend.encode_batch(list(texts), allowed_special="all")
        return backend.encode_ordinary_batch(list(texts))
    backend.encode_special_tokens = not special_text  # True: special tokens' text stays text
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
    check_training_numbers(vocab_size=vocab_size, min_frequency=min_frequency)
    out = check_out_dir(out_dir, command=TRAIN_COMMAND, own_name=TOKENIZER_NAMES.__contains__,
                        unmarked_ok=_made_by_meshrun)
    files = expand_inputs([str(f) for f in files], exclude=out)
    for f in files:
        hash_and_check(f, hashlib.sha256())
    if not any(f.stat().st_size for f in files):
        raise ValueError(f"no text to learn from: {len(files)} input file(s), all empty "
                         "(fix: give non-empty UTF-8 text files); nothing was written")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=list(TRAINED_SPECIALS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(f) for f in files], trainer)
    learned = tokenizer.get_vocab_size(with_added_tokens=True) - (256 + len(TRAINED_SPECIALS))
    if learned <= 0:
        raise ValueError(f"learned no tokens beyond the 256 bytes from {len(files)} file(s) "
                         f"(--min-frequency={min_frequency}: no pair of symbols occurs that "
                         "often) (fix: more text, or a lower --min-frequency); nothing was "
                         "written")
    try:
        with staged_dir(out, command=TRAIN_COMMAND) as stage:
            tokenizer.save(str(stage / TOKENIZER_FILE))
            (stage / TOKENIZER_CONFIG).write_text(TRAINED_CONFIG)
    except OSError as err:
        raise os_problem(err, out) from None
    return tokenizer_file(out)


def check_training_numbers(*, vocab_size: int, min_frequency: int) -> None:
    """ValueError naming the flag: the tokenizers library aborts the whole process (a failed
    allocation of ~66 bytes per entry) for a vocab size of 2**30, and overflows below 0."""
    floor = 256 + len(TRAINED_SPECIALS)
    if not floor <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"--vocab-size={vocab_size}: must be in {floor}..{MAX_VOCAB_SIZE} (a "
                         f"byte-level BPE has 256 bytes + {len(TRAINED_SPECIALS)} special "
                         "tokens; the largest real vocabularies are about 262,144)")
    if not 0 <= min_frequency <= 1 << 32:
        raise ValueError(f"--min-frequency={min_frequency}: must be in 0..{1 << 32} (how often "
                         "a pair must occur to be merged)")


def _made_by_meshrun(folder: Path) -> bool:
    """An --out from before the marker: its tokenizer_config.json is the one written below."""
    try:
        return (folder / TOKENIZER_CONFIG).read_text() == TRAINED_CONFIG
    except OSError:
        return False
