"""Rank-side code of tests/distributed/test_eval_layouts.py: score a task under a run's
layout (its own init, the same weights as one process) and report the scores."""
from __future__ import annotations

import contextlib

import torch

from conf.eval_tasks import MultipleChoiceDoc
from conf.run_dir.spec_io import spec_from_dict
from conf.spec import RunSpec

CPU = torch.device("cpu")


def layout_scorer(spec: RunSpec, model):
    from training.evals.task_scores import Scorer
    from training.evals.text_encoder import byte_encoder

    return Scorer(model=model, encode=byte_encoder, device=CPU,
                  autocast=contextlib.nullcontext(), max_len=spec.model.max_seq_len,
                  batch_size=2)


def all_choice_scores(scorer, docs: list[MultipleChoiceDoc]) -> list[float]:
    """Every choice's log-likelihood sum, all documents on this rank (not sharded)."""
    from training.evals.loglikelihood import encode_request, score_requests

    requests = [encode_request(scorer.encode, d.context, c, max_len=scorer.max_len)
                for d in docs for c in d.continuations()]
    return [s for s, _ in score_requests(scorer.model, requests, device=CPU,
                                         autocast=scorer.autocast, batch_size=3)]


def eval_layout_rank(*, rank: int, world_size: int, spec_dicts: list[dict],
                     docs: list[MultipleChoiceDoc]) -> list[dict]:
    """Per spec: the task's metrics (each dp rank scoring its share) and every choice's
    score computed on this rank."""
    from training.evals.task_scores import score_task
    from training.parallel_model import build_parallel_model

    out = []
    for spec_dict in spec_dicts:
        spec = spec_from_dict(RunSpec, spec_dict)
        scorer = layout_scorer(spec, build_parallel_model(spec, rank=rank, device=CPU))
        out.append({"metrics": score_task(scorer, docs),
                    "choices": all_choice_scores(scorer, docs)})
    return out
