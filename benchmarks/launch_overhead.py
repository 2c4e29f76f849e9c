"""Seconds from `meshrun run` to the first training step, against a bare `torchrun`.

Both start the same number of CPU ranks on this machine. The bare torchrun runs a trivial
script (import torch, join a gloo group, all-reduce one tensor); meshrun runs the tiny model
for one step. Rounds alternate; the median of each phase is printed, in seconds from the
moment the command was started:

  bare torchrun   rank python started   torchrun itself: python, import torch, spawn the ranks
                  imports done          the rank's `import torch`
                  joined                init_process_group (rendezvous)
                  all-reduce done
  meshrun run     run dir written       the CLI: imports, compose, resolve, data check, run dir
                                        (split by the CLI probe below)
                  rank python started   torchrun itself, as above
                  imports done          the rank's imports (rank 0's log: "start-up ... imports")
                  joined                init_process_group (rendezvous)
                  preflight passed      join/all-reduce/bandwidth check (cluster.preflight)
                  peak measured         the CPU peak (MFU line; before the build since W&B
                                        starts in the background with the build)
                  train state built     model build, optimizer, data, restore, loggers
                  step-0 eval           the first validation pass (and waiting for W&B)
                  step 1 logged         the first training step

The CLI probe is a separate process that calls the functions `meshrun run` calls, in its
order, and times each: imports, Hydra compose, resolve, config YAML, data check, run dir.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/launch_overhead.py [--rounds 5] [--procs 2]
        [--wandb] [--against /path/to/other/checkout]

--wandb logs to W&B offline (default: logging=disabled). --against runs another checkout's
`meshrun run` (e.g. the main branch) in the same alternating rounds and prints its phases
beside this one's, so a change is measured under the same load.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OVERRIDES = ["model=tiny", "data=synthetic", "training.steps=1", "training.seq_len=32",
             "training.micro_batch_size=2", "training.global_batch_size=8",
             "training.grad_accum_steps=-1", "training.eval_every=0", "logging=disabled",
             "checkpoint.every_steps=0", "checkpoint.export_safetensors=false"]
TRIVIAL = """
import json, os, sys, time
started = time.time()
import torch, torch.distributed as dist
imported = time.time()
dist.init_process_group("gloo")
joined = time.time()
dist.all_reduce(torch.ones(1))
if dist.get_rank() == 0:
    marks = {"rank python started": started, "imports done": imported, "joined": joined,
             "all-reduce done": time.time()}
    open(sys.argv[1], "w").write(json.dumps(marks))
dist.destroy_process_group()
"""
STARTUP = re.compile(r" rank0 meshrun\.main INFO rank 0/.*start-up ([\d.]+) s: imports "
                     r"([\d.]+) s")
MARKS = {"joined": r" rank0 meshrun\.main INFO rank 0/", "preflight passed": r"preflight passed",
         "peak measured": r"MFU = achieved", "train state built": r"train state built in",
         "step-0 eval": r"step 0: val loss", "W&B started": r"W&B started in"}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
WRITTEN_ONCE = ("spec.json", "config.yaml", "overrides.json", "command.txt", "env.json")


def bare_torchrun(procs: int, work: Path) -> dict[str, float]:
    script, done = work / "trivial.py", work / "done.json"
    script.write_text(TRIVIAL)
    start = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={procs}", str(script), str(done)], check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return {name: t - start for name, t in json.loads(done.read_text()).items()}


def log_marks(log: Path) -> dict[str, float]:
    times = {}
    for line in log.read_text().splitlines():
        match = STAMP.match(line)
        if not match:
            continue
        stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for name, pattern in MARKS.items():
            if name not in times and re.search(pattern, line):
                times[name] = stamp
        startup = STARTUP.search(line)
        if startup:
            times["rank python started"] = stamp - float(startup.group(1))
            times["imports done"] = times["rank python started"] + float(startup.group(2))
    return times


def meshrun_phases(procs: int, work: Path, extra: list[str], *,
                   repo: Path = REPO) -> dict[str, float]:
    runs = work / f"runs{time.monotonic_ns()}"
    start = time.time()
    subprocess.run([sys.executable, "-m", "launcher.cli", "run", *OVERRIDES, *extra,
                    f"cluster.procs_per_node={procs}", f"runs_dir={runs}"], cwd=repo,
                   check=True, capture_output=True, env=_env_for(repo))
    (run_dir,) = list(runs.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    marks = log_marks(run_dir / "logs" / "rank0.log")
    marks["run dir written"] = max((run_dir / name).stat().st_mtime for name in WRITTEN_ONCE)
    marks["step 1 logged"] = next(r["time"] for r in rows if r["kind"] == "train")
    return {name: t - start for name, t in sorted(marks.items(), key=lambda kv: kv[1])}


def _env_for(repo: Path) -> dict[str, str]:
    """This environment, with `repo` first on PYTHONPATH (its meshrun, not this one's)."""
    path = [str(repo)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                          if p and Path(p).resolve() != REPO]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def cli_probe(runs: str, overrides: list[str]) -> None:
    """Run in its own process: time each step `meshrun run` takes before it starts torchrun."""
    t0 = time.perf_counter()
    steps: dict[str, float] = {}

    def done(name: str) -> None:
        steps[name] = time.perf_counter() - t0 - sum(steps.values())

    importlib.import_module("launcher.cli")  # what `meshrun` imports before it parses
    from conf.compose import compose_config, config_yaml
    from conf.resolve import resolve
    from launcher import commands
    from launcher.hardware import probe_host
    from launcher.run_dir_writer import create_run_dir
    done("imports")
    cfg = compose_config(overrides)
    done("compose")
    spec = resolve(cfg, host=probe_host())
    done("resolve")
    yaml_text = config_yaml(cfg)
    done("config yaml")
    command = commands.launch_command(spec)
    spec = commands.with_prepared_data(spec)
    done("data check")
    create_run_dir(spec, overrides=overrides, config_yaml=yaml_text, command=command)
    done("run dir")
    steps["torch imported"] = float("torch" in sys.modules)
    print(json.dumps(steps))


def probe_cli(procs: int, work: Path, extra: list[str]) -> dict[str, float]:
    runs = work / f"probe{time.monotonic_ns()}"
    out = subprocess.run([sys.executable, __file__, "--cli-probe", str(runs), *OVERRIDES, *extra,
                          f"cluster.procs_per_node={procs}", f"runs_dir={runs}"], cwd=REPO,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def _median(rounds: list[dict[str, float]], name: str) -> float:
    return statistics.median(r[name] for r in rounds if name in r)


def report(procs: int, bare: list[dict], phases: list[dict], cli: list[dict],
           against: list[dict]) -> None:
    print(f"{procs} CPU ranks, median of {len(bare)} alternating rounds (s from enter):")
    for label, rounds in (("bare torchrun", bare), ("meshrun run", phases),
                          ("--against", against)):
        if not rounds:
            continue
        for name in sorted(rounds[0], key=lambda n: _median(rounds, n)):
            print(f"  {label:<13} -> {name:<22} {_median(rounds, name):6.2f}")
    steps = ", ".join(f"{name} {_median(cli, name):.2f}" for name in cli[0]
                      if name != "torch imported")
    print(f"  CLI probe (s each): {steps}; torch imported: {bool(cli[0]['torch imported'])}")
    rank_imports = _median(phases, "imports done") - _median(phases, "rank python started")
    bare_imports = _median(bare, "imports done") - _median(bare, "rank python started")
    print(f"  rank imports: meshrun {rank_imports:.2f} s, bare `import torch` {bare_imports:.2f} s")
    first = _median(phases, "step 1 logged") - _median(bare, "all-reduce done")
    print(f"  meshrun overhead over bare torchrun: {first:+.2f} s")
    if against:
        other = _median(against, "step 1 logged") - _median(bare, "all-reduce done")
        print(f"  --against overhead over bare torchrun: {other:+.2f} s")


def main() -> None:
    if sys.argv[1:2] == ["--cli-probe"]:
        cli_probe(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--wandb", action="store_true", help="log to W&B offline")
    parser.add_argument("--against", type=Path, help="another checkout to time alongside")
    parser.add_argument("overrides", nargs="*", help="extra meshrun overrides")
    args = parser.parse_args()
    if args.wandb:
        OVERRIDES[OVERRIDES.index("logging=disabled")] = "logging=offline"
    bare, phases, cli, against = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            bare.append(bare_torchrun(args.procs, Path(tmp)))
            phases.append(meshrun_phases(args.procs, Path(tmp), args.overrides))
            if args.against:
                against.append(meshrun_phases(args.procs, Path(tmp), args.overrides,
                                              repo=args.against.resolve()))
            cli.append(probe_cli(args.procs, Path(tmp), args.overrides))
    report(args.procs, bare, phases, cli, against)


if __name__ == "__main__":
    main()
