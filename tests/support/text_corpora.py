"""Small text corpora for the data tests: the word list they draw from, a folder of text and
JSONL documents, a two-turn chat, and a BPE tokenizer trained on those words."""
from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog while gradients flow through every "
         "shard of token data and the loss falls step by step").split()
TWO_TURNS = [{"role": "system", "content": "be brief"},
             {"role": "user", "content": "what jumps over the dog"},
             {"role": "assistant", "content": "the quick brown fox"},
             {"role": "user", "content": "and then"},
             {"role": "assistant", "content": "the loss falls"}]


def write_corpus(root: Path) -> Path:
    """`root/corpus`: 12 text files and one JSONL of 8 records (text in "body", some non-ASCII)."""
    rnd = random.Random(0)
    folder = root / "corpus"
    folder.mkdir()
    for i in range(12):
        (folder / f"doc{i:02d}.txt").write_text(" ".join(rnd.choices(WORDS, k=300)) + "\n")
    with open(folder / "records.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": i, "body": " ".join(rnd.choices(WORDS, k=150)) + " 漢字 é"})
                    + "\n")
    return folder


def trained_tokenizer(root: Path) -> Path:
    """A 320-token BPE trained on WORDS and the default template's markers: its folder."""
    from launcher.data.hf_tokenizer import train_bpe

    rnd = random.Random(0)
    corpus = root / "corpus.txt"
    corpus.write_text(" ".join(rnd.choices(WORDS, k=4000)) + " <|user|> <|end|> <|assistant|>")
    return train_bpe([corpus], vocab_size=320, out_dir=root / "tok").parent
