"""Packed rows of documents ending in EOS, for the document-mask tests (one process and the
tp / cp / pp layouts): the packed batch the data gives, each document alone as its own batch,
and the tolerances a packed step is held to against its documents run one by one."""
from __future__ import annotations

import torch

from training.loss import IGNORE_INDEX

NO_AUTOCAST = torch.autocast("cpu", enabled=False)
EOS = 3
RTOL, ATOL = 1e-5, 1e-6
"""fp32: packed and one-by-one run different matmul shapes, so rounding differs (~1e-7)."""


def packed_documents(lengths: list[list[int]], *, seed: int = 0) -> list[list[torch.Tensor]]:
    """Per row, documents of the given lengths: random ids (never EOS) ending in EOS; a row's
    last document may be cut by the window (its length then counts no EOS)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for row in lengths:
        docs = []
        for i, length in enumerate(row):
            doc = torch.randint(EOS + 1, 256, (length,), generator=gen)
            if i < len(row) - 1 or length % 2 == 0:  # some rows end mid-document
                doc[-1] = EOS
            docs.append(doc)
        rows.append(docs)
    return rows


def packed_batch(rows: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) [B, T] as the data gives them: plain next-token targets, also where
    the input ends a document (training must not learn those: the next document's first
    token is not the ending document's to predict)."""
    inputs = torch.stack([torch.cat(docs) for docs in rows])
    targets = torch.full_like(inputs, IGNORE_INDEX)
    targets[:, :-1] = inputs[:, 1:]
    return inputs, targets


def document_batches(rows: list[list[torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each document alone as a [1, len] batch: its own next tokens, the EOS among them (a
    document learns where it ends), none after its last token."""
    batches = []
    for docs in rows:
        for doc in docs:
            targets = torch.full_like(doc, IGNORE_INDEX)
            targets[:-1] = doc[1:]
            batches.append((doc[None], targets[None]))
    return batches


def document_targets_count(rows: list[list[torch.Tensor]]) -> int:
    """Targets of all documents run alone: what a packed step must learn, and count."""
    return sum(int((y != IGNORE_INDEX).sum()) for _, y in document_batches(rows))


LENGTHS = [[7, 12, 13], [5, 9, 10, 8]]  # two rows of 32 tokens; row 1 ends mid-document
