"""A meshrun model as lm-eval's `LM`: its `loglikelihood` requests go through meshrun's own
scorer (training/evals/loglikelihood.py), so lm-eval and the in-training evals agree.

lm-eval runs offline on local files: the task config is conf.eval_tasks.lm_eval_task (the
`json` dataset builder on the JSONL file), its TaskManager is made without lm-eval's own
task index (`include_defaults=False`: indexing the built-in tasks costs tens of seconds),
and the Hugging Face hub and datasets are set offline before lm-eval is imported.
"""
from __future__ import annotations

import os

import torch

from training.evals.loglikelihood import encode_request, score_requests
from training.evals.task_scores import Scorer

FEWSHOT_SEED = 1234
"""lm-eval's default fewshot seed (the tasks are zero-shot: conf.eval_tasks.lm_eval_task)."""
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_TRUST_REMOTE_CODE": "0"}


def lm_eval_class():
    """The `LM` subclass (built on first use: importing lm-eval costs seconds)."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    from lm_eval.api.model import LM

    class MeshrunLM(LM):
        def __init__(self, scorer: Scorer) -> None:
            super().__init__()
            self.scorer = scorer

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            s = self.scorer
            tokens = [encode_request(s.encode, *r.args, max_len=s.max_len) for r in requests]
            return score_requests(s.model, tokens, device=s.device, autocast=s.autocast,
                                  batch_size=s.batch_size)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("meshrun eval scores multiple-choice tasks only")

        def generate_until(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("meshrun eval scores multiple-choice tasks only")

    return MeshrunLM


def lm_eval_scores(scorer: Scorer, tasks: list[dict], *,
                   limits: dict[str, int] | None = None) -> dict[str, dict]:
    """{task: {"acc", "acc_norm", "n"}} from lm-eval's `evaluate` on `tasks`
    (conf.eval_tasks.lm_eval_task configs), one process; `limits`: the first N documents of
    the tasks it names. (Not `simple_evaluate`: it spends 10-20 s collecting environment
    info, `pip list` and git hashes, for a report this does not write.)"""
    model = lm_eval_class()(scorer)
    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager

    loaded = TaskManager(include_defaults=False).load(tasks)
    for task in loaded["tasks"].values():
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
    with torch.no_grad():
        out = evaluator.evaluate(
            lm=model, task_dict=loaded,
            samples={k: list(range(n)) for k, n in limits.items()} if limits else None,
            bootstrap_iters=0, log_samples=False, verbosity="ERROR")
    return {name: {"acc": r["acc,none"], "acc_norm": r["acc_norm,none"],
                   "n": int(r["sample_len"])}
            for name, r in out["results"].items()}
