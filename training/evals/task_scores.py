"""Multiple-choice tasks scored on a run's model, sharded over the data-parallel ranks:
each dp rank scores every dp-th document, and the counts are summed over all ranks (only
ranks that report the loss count, so tensor-parallel peers count a document once)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from conf.eval_tasks import MultipleChoiceDoc, metric_key
from training.dist import all_reduce_sum
from training.evals.loglikelihood import encode_request, score_requests
from training.evals.text_encoder import Encoder
from training.parallel_model import ParallelModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Scorer:
    """What scoring needs besides the documents: the model, how to encode text, the device."""

    model: ParallelModel
    encode: Encoder
    device: torch.device
    autocast: object
    max_len: int
    batch_size: int
    progress: Callable[[], None] | None = None
    """Called after each forward batch (training: the rank's heartbeat)."""


def doc_outcome(doc: MultipleChoiceDoc, scores: list[tuple[float, bool]]) -> tuple[float, float]:
    """(acc, acc_norm) of one document from its choices' scores, as lm-eval computes them:
    the first highest sum (acc), the first highest sum per character of the choice (acc_norm)."""
    sums = [s for s, _ in scores]
    norm = [s / len(choice) for s, choice in zip(sums, doc.choices)]
    best = max(range(len(sums)), key=sums.__getitem__)
    best_norm = max(range(len(norm)), key=norm.__getitem__)
    return float(best == doc.gold), float(best_norm == doc.gold)


def score_task(scorer: Scorer, docs: list[MultipleChoiceDoc]) -> dict[str, float]:
    """acc, acc_norm and n over all of `docs` (this rank scores its dp share). Collective."""
    m = scorer.model
    mine = docs[m.dims.dp_rank(m.rank)::m.dims.dp]
    requests = [encode_request(scorer.encode, doc.context, cont, max_len=scorer.max_len)
                for doc in mine for cont in doc.continuations()]
    scores = score_requests(m, requests, device=scorer.device, autocast=scorer.autocast,
                            batch_size=scorer.batch_size, progress=scorer.progress)
    acc = acc_norm = 0.0
    at = 0
    for doc in mine:
        a, a_norm = doc_outcome(doc, scores[at:at + len(doc.choices)])
        acc, acc_norm, at = acc + a, acc_norm + a_norm, at + len(doc.choices)
    counted = 1.0 if m.reports_loss else 0.0
    acc, acc_norm, n = all_reduce_sum([acc * counted, acc_norm * counted,
                                       len(mine) * counted], scorer.device)
    return {"acc": acc / n, "acc_norm": acc_norm / n, "n": int(n)}


def score_tasks(scorer: Scorer, tasks: dict[str, list[MultipleChoiceDoc]]) -> dict[str, float]:
    """Every task's metrics as `eval/<task>/<metric>` (conf.eval_tasks.metric_key)."""
    row = {}
    for name, docs in tasks.items():
        row.update({metric_key(name, k): v for k, v in score_task(scorer, docs).items()})
    return row
