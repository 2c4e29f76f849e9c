"""`meshrun eval TARGET tasks=... [limit=N] [batch_size=N] [harness=lm_eval|meshrun]`: score
multiple-choice tasks (conf/eval_tasks.py) on a finished run's export or on a Hugging Face
folder, in one process (`python -m training.evals`), through lm-eval when it is installed.

  meshrun eval runs/tiny-20261202-1700 tasks=piqa.jsonl,arc=data/arc_easy.jsonl limit=500

A task is `PATH` (named by its file stem) or `NAME=PATH`. Every input is checked before the
model loads (exit 2). On a run dir the scores are appended to its metrics.jsonl as one
`task_eval` row at its last step (`meshrun compare` shows them); nothing else is written.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from conf.errors import ProblemList
from conf.eval_tasks import METRICS, ROW_KIND, metric_key, read_task_file, task_name
from conf.hf_model_config import is_hf_model_dir
from conf.data_contract.tokenizer_info import TOKENIZER_FILE
from conf.run_dir.paths import RunDir

KNOBS = {"tasks": "", "limit": "0", "batch_size": "8", "harness": ""}
"""The command's KEY=VALUE words and their defaults (harness: lm_eval when installed)."""
HARNESSES = ("lm_eval", "meshrun")
TITLE = "Cannot evaluate"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="score multiple-choice tasks (JSONL) on a finished run or an export",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path, help="a run dir (its export) or a Hugging Face "
                        "model folder")
    parser.add_argument("words", nargs="*", metavar="KEY=VALUE",
                        help="tasks=[NAME=]PATH,... limit=N batch_size=N harness=lm_eval|meshrun")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.set_defaults(handler=handle_eval)


def handle_eval(args: argparse.Namespace, console: Console) -> int:
    knobs = parse_words(args.words)
    request, run_dir = build_request(args.target, knobs)
    with _locked(run_dir):  # a live run (or another eval) holding it is refused first
        result = run_scorer(request)
        if run_dir is not None:
            append_row(run_dir, result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_scores(result, console)
    return 0


def parse_words(words: list[str]) -> dict[str, str]:
    problems = ProblemList()
    knobs = dict(KNOBS)
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or key not in KNOBS:
            problems.add(key if sep else word, value, "is not a key of `meshrun eval`",
                         f"use {', '.join(f'{k}=...' for k in KNOBS)}")
        else:
            knobs[key] = value
    for key in ("limit", "batch_size"):
        if not knobs[key].isdigit() or (key == "batch_size" and int(knobs[key]) < 1):
            problems.add(key, knobs[key], "must be a whole number" + (" >= 1" if key ==
                         "batch_size" else " (0 = all)"), f"e.g. {key}={KNOBS[key] or 8}")
    if not knobs["tasks"]:
        problems.add("tasks", "", "is required", "tasks=PATH.jsonl or tasks=NAME=PATH,...")
    harness = knobs["harness"] or ("lm_eval" if _has_lm_eval() else "meshrun")
    if harness not in HARNESSES:
        problems.add("harness", harness, f"is not one of {', '.join(HARNESSES)}",
                     "harness=lm_eval (pip install lm-eval) or harness=meshrun")
    elif harness == "lm_eval" and not _has_lm_eval():
        problems.add("harness", harness, "lm-eval is not installed",
                     "pip install 'lm-eval>=0.4,<0.5', or harness=meshrun")
    problems.raise_if_any(TITLE)
    return {**knobs, "harness": harness}


def _has_lm_eval() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def build_request(target: Path, knobs: dict[str, str]) -> tuple[dict, Path | None]:
    """The scorer's request, every input checked; the run dir to log into (None: a folder)."""
    problems = ProblemList()
    tasks = _tasks(knobs["tasks"], limit=int(knobs["limit"]), problems=problems)
    spec, weights, tokenizer, run_dir = _model(target, problems)
    problems.raise_if_any(TITLE)
    return {"spec": spec, "weights": str(weights), "tokenizer": tokenizer,
            "tasks": tasks, "limit": int(knobs["limit"]), "batch_size": int(knobs["batch_size"]),
            "harness": knobs["harness"]}, run_dir


def _tasks(text: str, *, limit: int, problems: ProblemList) -> list[dict]:
    tasks = []
    for item in filter(None, text.split(",")):
        name, sep, path = item.partition("=")
        name, path = (name, path) if sep else ("", item)
        name = task_name(name, path)
        read_task_file(path, key=f"tasks[{name}]", problems=problems, limit=limit)
        tasks.append({"name": name, "path": str(Path(path).expanduser().resolve()), "limit": 0})
    names = [t["name"] for t in tasks]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.add("tasks", name, "names two tasks", "give each NAME=PATH its own name")
    return tasks


def _model(target: Path, problems: ProblemList) -> tuple[dict, Path, str, Path | None]:
    """(spec as spec.json holds it, weights folder, tokenizer, run dir or None) of a run dir
    or an export."""
    rd = RunDir(target)
    if rd.is_run_dir:
        weights = rd.export_dir
        if not is_hf_model_dir(weights):
            problems.add("target", str(target), f"has no export in {weights.name}/ (a run "
                         "exports when it finishes, with checkpoint.export_safetensors=true)",
                         "finish the run (`meshrun resume`), or pass an export folder")
        tokenizer = _folder_tokenizer(weights) or rd.read_spec().data.tokenizer
        return json.loads(rd.spec_file.read_text()), weights, tokenizer, target
    if not is_hf_model_dir(target):
        problems.add("target", str(target), "is neither a meshrun run dir nor a Hugging Face "
                     "model folder (config.json + safetensors)", "pass a run dir or an export")
        return {}, Path(), "", None
    return _export_spec(target), target, _folder_tokenizer(target), None


def _folder_tokenizer(folder: Path) -> str:
    return str(folder / TOKENIZER_FILE) if (folder / TOKENIZER_FILE).is_file() else ""


def _export_spec(folder: Path) -> dict:
    """The spec of a bare Hugging Face folder: `model=hf model.path=FOLDER`, composed and
    resolved as `meshrun run` would (its problems are ConfigErrors)."""
    from conf.run_dir.spec_io import spec_to_dict
    from launcher.commands import compose_spec

    spec, _ = compose_spec(["model=hf", f"model.path={folder.resolve()}",
                            "data=synthetic", "cluster.procs_per_node=1"])
    return spec_to_dict(spec)


def run_scorer(request: dict) -> dict:
    """`python -m training.evals` on the request; its failure is a one-line error (exit 1)."""
    with tempfile.TemporaryDirectory(prefix="meshrun-eval-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]),
                          os.environ.get("PYTHONPATH", "")]))}
        done = subprocess.run([sys.executable, "-m", "training.evals", str(req), str(res)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        if done.returncode != 0 or not res.is_file():
            tail = "\n".join(done.stdout.strip().splitlines()[-15:])
            raise SystemExit(f"meshrun eval: the scorer failed (exit {done.returncode}):\n{tail}")
        return json.loads(res.read_text())


def _locked(run_dir: Path | None):
    """The run dir's lock (launcher/backends/run_lock.py) while scoring into it."""
    import contextlib

    from launcher.backends.run_lock import acquire_run_lock

    return contextlib.nullcontext() if run_dir is None else acquire_run_lock(
        run_dir, action="evaluate")


def append_row(run_dir: Path, result: dict) -> None:
    """One task_eval row at the run's last step (the caller holds the run dir's lock)."""
    rd = RunDir(run_dir)
    steps = [r["step"] for r in rd.read_rows() if isinstance(r.get("step"), int)]
    row = {"kind": ROW_KIND, "step": max(steps, default=0), "source": "meshrun eval",
           "harness": result["harness"]}
    for task, scores in result["scores"].items():
        row.update({metric_key(task, k): scores[k] for k in (*METRICS, "n")})
    with rd.metrics_file.open("a") as out:
        out.write(json.dumps(row) + "\n")


def print_scores(result: dict, console: Console) -> None:
    seconds = result["seconds"]
    console.print(f"harness {result['harness']} on {result['device']}: model loaded in "
                  f"{seconds['load']:.1f} s, scored in {seconds['score']:.1f} s", markup=False)
    for task, s in result["scores"].items():
        console.print(f"  {task}: acc {s['acc']:.4f}  acc_norm {s['acc_norm']:.4f}  "
                      f"(n={s['n']})", markup=False)
