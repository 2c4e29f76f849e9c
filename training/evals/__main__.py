"""`python -m training.evals REQUEST.json RESULT.json`: score tasks on a finished model, one
process (what `meshrun eval` runs; launcher/eval_command.py writes the request).

REQUEST: {"spec": the model's spec (spec.json's content), "weights": its Hugging Face export folder,
"tokenizer": "" or a tokenizer.json, "tasks": [{"name", "path", "limit"}], "limit": N,
"batch_size": N, "harness": "lm_eval" | "meshrun"}. RESULT: {"scores": {task: {acc, acc_norm,
n}}, "harness", "seconds": {"load", "score"}}.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def evaluate_request(request: dict) -> dict:
    import torch

    from conf.run_dir.spec_io import spec_from_dict
    from conf.spec import RunSpec
    from training.evals.in_training import read_tasks
    from training.evals.task_scores import Scorer, score_task
    from training.evals.text_encoder import build_encoder
    from training.hf_import import load_hf_model
    from training.parallel_model import ParallelModel
    from conf.spec import EvalSpec, EvalTaskSpec

    started = time.perf_counter()
    spec = spec_from_dict(RunSpec, request["spec"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    module = load_hf_model(request["weights"], spec.model, device=device)
    scorer = Scorer(model=ParallelModel.single(module), encode=build_encoder(request["tokenizer"]),
                    device=device, autocast=_autocast(device), max_len=spec.model.max_seq_len,
                    batch_size=request["batch_size"])
    tasks = EvalSpec(tasks=tuple(EvalTaskSpec(**t) for t in request["tasks"]),
                     limit=request["limit"])
    loaded = time.perf_counter()
    if request["harness"] == "lm_eval":
        scores = _lm_eval(scorer, tasks)
    else:
        scores = {name: score_task(scorer, docs) for name, docs in read_tasks(tasks).items()}
    return {"scores": scores, "harness": request["harness"], "device": str(device),
            "seconds": {"load": loaded - started, "score": time.perf_counter() - loaded}}


def _lm_eval(scorer, tasks) -> dict:
    from conf.eval_tasks import lm_eval_task
    from training.evals.lm_eval_model import lm_eval_scores

    from training.evals.in_training import read_tasks

    docs = read_tasks(tasks)  # each cut to its limit
    limits = {t.name: len(docs[t.name]) for t in tasks.tasks if t.limit or tasks.limit}
    return lm_eval_scores(scorer, [lm_eval_task(t.name, t.path) for t in tasks.tasks],
                          limits=limits)


def _autocast(device):
    import contextlib

    import torch

    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m training.evals REQUEST.json RESULT.json\n")
        return 2
    result = evaluate_request(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
