"""A corpus of what `meshrun` prints without running anything (plan, plan --json, run --dry-run,
sweep previews, plan --search rankings), written one file per case, and a byte-for-byte compare
of two such corpora: the check that a refactor changed no output (issue 23).

    python benchmarks/plan_corpus.py write OUTDIR [--repo PATH] [--only SUBSTRING]
    python benchmarks/plan_corpus.py compare DIR_A DIR_B [--show 5]

`write` runs the checkout at PATH (default: the one holding this script): PATH goes first on
sys.path and becomes the working directory, so every import comes from it, and the commands
the checkout's pyproject.toml registers (`meshrun.commands`, e.g. `sweep`) are the ones loaded,
whatever an older editable install says. Each case calls `launcher.cli:main` (the console
script, the one interface a refactor keeps) in this process with stdout and stderr captured;
a case file holds the command, its exit status and both streams, as a user sees them when
piped (80 columns, no colour). A spec that fails validation is a case too: its message is
output that must not change.

The corpus: every shipped model (conf/model, not hf) x every layout (conf/parallel) x four
devices (this machine's CPU, H100 on Slurm, A100 on `nodes`, H200 on Slurm), each at a world
size its layout accepts (tied-embedding models as shipped: they plan under tp and pp too),
with the recompute and precision options rotating over them so
that every pair of options of any two axes appears: `plan` of each, and of each (model,
layout) `plan --json` on two devices and `run --dry-run` on one, the devices rotating; every
shipped sweep file (and a few inline sweeps) with `--dry-run`; `plan --search` rankings,
llama3_70b on 1,024 H100s among them. OUTDIR/index.txt lists the cases.

Only what differs between two runs of the same code is masked: the runs dir (a fixed folder
under OUTDIR that nothing may create: the dry runs launch nothing), the checkout's own path,
and the timestamp in run-dir names. `write` refuses to run a case that could launch.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import importlib.metadata
import io
import os
import re
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RUNS_SUBDIR = "runs"
"""OUTDIR/runs: the runs_dir of every case; nothing may create it."""
SCRATCH_SUBDIR = "scratch"
"""OUTDIR/scratch: the working directory of cases that write a file (plan --search
--write-sweep), which the case file then shows."""
RUN_NAME = "corpus"
STAMP = re.compile(rf"(?<={RUN_NAME}-)\d{{8}}-\d{{6}}")
"""The timestamp of a run dir's name (runs_dir/<name>-YYYYmmdd-HHMMSS)."""
FIXED_ENV = {"COLUMNS": "80", "LINES": "25", "TERM": "dumb", "CUDA_VISIBLE_DEVICES": "",
             "MESHRUN_HOST_MEMORY_BYTES": str(24 * 1024**3)}
"""What a pipe gives rich (80 columns, no colour), so the caller's terminal does not leak in;
no GPU probed: `cluster=local` is this machine's CPU cores wherever the corpus is written; and
24 GiB of host memory for the CPU fit verdict (MemAvailable changes from one call to the next)."""
UNSET_ENV = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS",
             "JUPYTER_LINES", "MESHRUN_CONFIG_PATH")


@dataclass(frozen=True)
class Device:
    name: str
    cluster: tuple[str, ...]
    """Overrides that put the run on this device (the world size comes from `world_words`)."""
    kind: str
    """local, nodes or slurm: how `world_words` spells a world size."""


DEVICES = (
    Device("cpu", ("cluster=local",), "local"),
    Device("h100", ("cluster=slurm", "cluster.gpu_name=H100", "cluster.gpu_compute_capability=9.0"),
           "slurm"),
    Device("a100", ("cluster=nodes", "cluster.rdzv_host=10.0.0.1", "cluster.gpu_name=A100",
                    "cluster.gpu_compute_capability=8.0"), "nodes"),
    Device("h200", ("cluster=slurm", "cluster.gpu_name=H200", "cluster.gpu_compute_capability=9.0",
                    "cluster.partition=gpu"), "slurm"),
)
LAYOUT_WORLD = {"single": 1, "ddp": 4, "fsdp": 8, "zero1": 2, "zero2": 4, "zero3": 16, "tp": 2,
                "cp": 4, "pp": 4, "fsdp_tp": 8, "hsdp": 8, "3d": 8, "4d": 16}
"""Ranks per layout: sizes each layout's rules accept for most models (tp 2 divides every
shipped model's heads; pp 4 does not divide tiny's 2 layers: that refusal is a case too)."""
DEFAULT_WORLD = 8
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Case:
    path: str
    """Where its text goes, relative to OUTDIR."""
    argv: tuple[str, ...]
    """The words after `meshrun`."""
    reads: str = ""
    """A file the command writes (relative to the scratch dir), shown after its output."""


def options(repo: Path, group: str) -> list[str]:
    """The shipped options of a config group, by name."""
    return sorted(p.stem for p in (repo / "conf" / group).glob("*.yaml"))


def world_words(device: Device, world: int) -> list[str]:
    """Overrides that give `world` ranks on `device` (8 GPUs a node, whole nodes past 8)."""
    if device.kind == "local":
        return [f"cluster.procs_per_node={world}"]
    per_node = min(world, GPUS_PER_NODE)
    return [f"cluster.nodes={max(1, world // GPUS_PER_NODE)}", f"cluster.gpus_per_node={per_node}"]


def spec_words(repo: Path) -> list[tuple[str, list[str]]]:
    """(case name, overrides) for every model x layout x device, recompute and precision
    rotating with different strides so every pair of options of two axes comes up."""
    recomputes, precisions = options(repo, "recompute"), options(repo, "precision")
    specs = []
    models = [m for m in options(repo, "model") if m != "hf"]
    for m, model in enumerate(models):
        for p, layout in enumerate(options(repo, "parallel")):
            for d, device in enumerate(DEVICES):
                recompute = recomputes[(m + p + d) % len(recomputes)]
                precision = precisions[(m + 2 * p + 3 * d) % len(precisions)]
                words = [f"model={model}", f"parallel={layout}", f"recompute={recompute}",
                         f"precision={precision}", *device.cluster,
                         *world_words(device, LAYOUT_WORLD.get(layout, DEFAULT_WORLD))]
                specs.append((f"{model}-{layout}-{recompute}-{precision}-{device.name}", words))
    return specs


def spec_cases(repo: Path, runs_dir: Path) -> list[Case]:
    """plan of every spec; of each (model, layout), plan --json on two of the devices and
    run --dry-run on one, the devices rotating (a spec costs a quarter second: all three of
    every spec would take twice the time)."""
    cases = []
    for i, (name, words) in enumerate(spec_words(repo)):
        turn = (i - i // len(DEVICES)) % len(DEVICES)  # 0 for one device of each (model, layout)
        cases.append(Case(f"plan/{name}.txt", ("plan", *words)))
        if turn in (0, len(DEVICES) // 2):
            cases.append(Case(f"plan_json/{name}.txt", ("plan", "--json", *words)))
        if turn == 0:
            cases.append(Case(f"dry_run/{name}.txt", ("run", "--dry-run", *words,
                                                      f"runs_dir={runs_dir}", f"name={RUN_NAME}")))
    return cases


INLINE_SWEEPS = {
    "inline_layouts": ((), ("model=tiny", "parallel=ddp,fsdp,tp", "precision=fp32,bf16")),
    "inline_h100_nodes": ((), ("model=llama3_8b", "cluster=slurm", "cluster.gpu_name=H100",
                               "cluster.gpu_compute_capability=9.0", "cluster.nodes=1,2,4",
                               "parallel=fsdp,fsdp_tp,3d", "recompute=none,full",
                               "training.seq_len=4096")),
    "inline_random": (("--combine", "random", "--samples", "5", "--seed", "7"),
                      ("model=debug", "optim.lr=choice(1e-4,3e-4,1e-3,3e-3)",
                       "schedule.warmup_steps=0,10,20")),
    "inline_invalid": ((), ("model=debug", "parallel=tp,fsdp_tp,4d")),
    "inline_skip_invalid": (("--skip-invalid",), ("model=debug", "parallel=tp,fsdp_tp,4d")),
}
"""Sweeps given on the command line, name -> (options, overrides): a grid, a Slurm grid with
arrays, a random sample, and one with points the rules refuse (refused, then dropped)."""


def sweep_cases(repo: Path, runs_dir: Path) -> list[Case]:
    """The preview (--dry-run) of every shipped sweep file, one with --rows, and INLINE_SWEEPS
    (the overrides last and together: argparse takes its positionals in one run)."""
    runs = f"runs_dir={runs_dir}"
    files = options(repo, "sweeps")
    cases = [Case(f"sweep/{name}.txt", ("sweep", "--dry-run", "-f", name, runs))
             for name in files]
    cases += [Case(f"sweep/{name}-rows4.txt", ("sweep", "--dry-run", "--rows", "4", "-f", name,
                                               runs)) for name in files[:1]]
    cases += [Case(f"sweep/{name}.txt", ("sweep", "--dry-run", "--name", name, *flags, *words,
                                         runs))
              for name, (flags, words) in INLINE_SWEEPS.items()]
    return cases


H100_1024 = ("model=llama3_70b", "cluster=slurm", "cluster.nodes=128", "cluster.gpus_per_node=8",
             "cluster.gpu_name=H100", "cluster.gpu_compute_capability=9.0",
             "training.seq_len=8192", "data=synthetic")
"""Issue 23's search: llama3_70b on 1,024 H100s (as benchmarks/plan_search_time.py runs it)."""
SEARCHES = {
    "llama3_70b-h100x1024": ("--global-batch-tokens", "4194304", *H100_1024),
    "llama3_70b-h100x1024-json": ("--json", "--global-batch-tokens", "4194304", *H100_1024),
    "llama3_8b-h100x16": ("--global-batch-tokens", "1048576", "model=llama3_8b",
                          "cluster=slurm", "cluster.nodes=2", "cluster.gpus_per_node=8",
                          "cluster.gpu_name=H100", "training.seq_len=8192"),
    "llama3_8b-h100x16-json-top3": ("--json", "--top", "3", "--global-batch-tokens", "1048576",
                                    "model=llama3_8b", "cluster=slurm", "cluster.nodes=2",
                                    "cluster.gpu_name=H100", "training.seq_len=8192"),
    "qwen2_5_32b-a100x32-top5": ("--top", "5", "--global-batch-tokens", "2097152",
                                 "model=qwen2_5_32b", "cluster=nodes", "cluster.nodes=4",
                                 "cluster.rdzv_host=10.0.0.1",
                                 "cluster.gpus_per_node=8", "cluster.gpu_name=A100",
                                 "cluster.gpu_compute_capability=8.0",
                                 "training.seq_len=4096"),
    "qwen2_5_7b-h200x16-seq32k": ("--global-batch-tokens", "1048576", "model=qwen2_5_7b",
                                  "cluster=slurm", "cluster.nodes=2", "cluster.gpu_name=H200",
                                  "training.seq_len=32768", "precision=bf16"),
    "tiny-cpu4": ("model=tiny", "cluster.procs_per_node=4", "training.global_batch_size=16"),
    "bad-batch-tokens": ("--global-batch-tokens", "1000", "model=llama3_8b", "cluster=slurm",
                         "cluster.gpu_name=H100", "training.seq_len=8192"),
}
"""plan --search cases: name -> the words after `plan --search`."""


def search_cases() -> list[Case]:
    """SEARCHES, and one that writes its ranking as a sweep file."""
    cases = [Case(f"search/{name}.txt", ("plan", "--search", *words))
             for name, words in SEARCHES.items()]
    cases.append(Case("search/llama3_8b-h100x16-write-sweep.txt",
                      ("plan", "--search", "--top", "4", "--write-sweep", "best.yaml",
                       *SEARCHES["llama3_8b-h100x16"]), reads="best.yaml"))
    return cases


def all_cases(repo: Path, runs_dir: Path) -> list[Case]:
    return [*spec_cases(repo, runs_dir), *sweep_cases(repo, runs_dir), *search_cases()]


def may_launch(argv: tuple[str, ...]) -> bool:
    """Could this command start ranks or submit a job? (the corpus only prints)"""
    if argv[0] in ("run", "sweep"):
        return "--dry-run" not in argv
    return argv[0] in ("resume", "preflight")


def checkout_entry_points(repo: Path):
    """The entry points the checkout's pyproject.toml declares, by group (what installing that
    checkout would register)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    return {group: importlib.metadata.EntryPoints(
                importlib.metadata.EntryPoint(name, value, group) for name, value in eps.items())
            for group, eps in project.get("entry-points", {}).items()}


@contextlib.contextmanager
def checkout_environment(repo: Path, outdir: Path):
    """Imports from `repo`, its entry points, a pinned console and no calibration file."""
    original = importlib.metadata.entry_points
    declared = checkout_entry_points(repo)

    def entry_points(**params):
        group = params.get("group")
        return declared[group] if group in declared and len(params) == 1 else original(**params)

    saved_env, saved_cwd, saved_path = dict(os.environ), os.getcwd(), list(sys.path)
    sys.path.insert(0, str(repo))
    os.chdir(repo)
    for key in UNSET_ENV:
        os.environ.pop(key, None)
    os.environ.update(FIXED_ENV, MESHRUN_HOME=str(outdir / "meshrun_home"))
    importlib.metadata.entry_points = entry_points
    try:
        yield
    finally:
        importlib.metadata.entry_points = original
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.path[:] = saved_path


def load_main(repo: Path):
    """launcher.cli.main of the checkout at `repo` (refused if it would come from elsewhere)."""
    module = importlib.import_module("launcher.cli")
    check_modules_from(repo)
    return module.main


def check_modules_from(repo: Path) -> None:
    """Exit if a module of the checkout's packages was imported from another folder (an
    earlier import in this process, or an editable install of another checkout)."""
    ours = {p.name for p in repo.iterdir() if (p / "__init__.py").is_file()}
    foreign = sorted(name for name, module in list(sys.modules.items())
                     if name.split(".")[0] in ours and getattr(module, "__file__", None)
                     and not Path(module.__file__).resolve().is_relative_to(repo))
    if foreign:
        sys.exit(f"imported from outside {repo}: {', '.join(foreign[:5])}: "
                 "run plan_corpus.py in a fresh process")


def run_case(main, case: Case, scratch: Path) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `meshrun <case.argv>` in this process."""
    if may_launch(case.argv):
        raise ValueError(f"the corpus only prints; this could launch: {case.argv}")
    out, err = io.StringIO(), io.StringIO()
    cwd = scratch if case.reads else Path.cwd()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(case.argv))
        except SystemExit as exc:  # argparse's errors and --help end this way
            status = exc.code
    return status, out.getvalue(), err.getvalue()


def case_text(case: Case, status, out: str, err: str, scratch: Path) -> str:
    """What a case file holds: the command, its exit status, its streams, the file it wrote."""
    parts = [f"$ meshrun {' '.join(case.argv)}", f"exit status: {status}",
             "--- stdout", out, "--- stderr", err]
    if case.reads:
        written = scratch / case.reads
        parts += [f"--- {case.reads}", written.read_text() if written.exists() else "(none)"]
        written.unlink(missing_ok=True)
    return "\n".join(parts)


def masked(text: str, *, runs_dir: Path, repo: Path) -> str:
    """`text` without what varies between two runs of the same code: the runs dir under
    OUTDIR, the checkout's path, the time in run-dir names."""
    text = text.replace(str(runs_dir), "<runs_dir>").replace(str(repo), "<repo>")
    return STAMP.sub("<time>", text)


def write(outdir: Path, repo: Path, only: str = "") -> int:
    """Run every case (or those whose path holds `only`) and write OUTDIR/<case path>."""
    outdir, repo = outdir.resolve(), repo.resolve()
    runs_dir, scratch = outdir / RUNS_SUBDIR, outdir / SCRATCH_SUBDIR
    if runs_dir.exists() or (outdir / "index.txt").exists():
        sys.exit(f"{outdir} holds a corpus already: write into a new OUTDIR")
    scratch.mkdir(parents=True, exist_ok=True)
    start, cpu_start, counts = time.perf_counter(), time.process_time(), {}
    with checkout_environment(repo, outdir):
        main = load_main(repo)
        cases = [c for c in all_cases(repo, runs_dir) if only in c.path]
        for n, case in enumerate(cases, 1):
            status, out, err = run_case(main, case, scratch)
            target = outdir / case.path
            target.parent.mkdir(parents=True, exist_ok=True)
            text = case_text(case, status, out, err, scratch)
            target.write_text(masked(text, runs_dir=runs_dir, repo=repo))
            kind = case.path.split("/")[0]
            counts[kind] = counts.get(kind, 0) + 1
            if n % 100 == 0:
                print(f"{n}/{len(cases)} cases, {time.perf_counter() - start:.0f} s", flush=True)
        check_modules_from(repo)
    if runs_dir.exists():
        sys.exit(f"a case created {runs_dir}: something was written or launched")
    (outdir / "index.txt").write_text("".join(f"{c.path}\n" for c in cases))
    by_kind = ", ".join(f"{kind} {n}" for kind, n in counts.items())
    print(f"{len(cases)} cases ({by_kind}) from {repo} in {time.perf_counter() - start:.0f} s "
          f"({time.process_time() - cpu_start:.0f} s CPU) -> {outdir}")
    return 0


def case_files(root: Path) -> dict[str, bytes]:
    """Every case file under `root` by its relative path (not index.txt, not the scratch dir)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("*/*"))
            if p.is_file() and p.parent.name != SCRATCH_SUBDIR}


def compare(a: Path, b: Path, show: int = 5) -> int:
    """Count identical cases, diff the first `show` that differ; 1 if any differ."""
    left, right = case_files(a), case_files(b)
    names = sorted(set(left) | set(right))
    differing = [n for n in names if left.get(n) != right.get(n)]
    print(f"{len(names)} cases: {len(names) - len(differing)} identical, {len(differing)} "
          f"differ ({sum(n not in right for n in names)} only in {a}, "
          f"{sum(n not in left for n in names)} only in {b})")
    for name in differing[:show]:
        diff = difflib.unified_diff(_lines(left.get(name)), _lines(right.get(name)),
                                    f"{a}/{name}", f"{b}/{name}")
        sys.stdout.writelines(diff)
    if len(differing) > show:
        print(f"... and {len(differing) - show} more: {', '.join(differing[show:show + 20])}")
    return 1 if differing else 0


def _lines(data: bytes | None) -> list[str]:
    return [] if data is None else data.decode(errors="replace").splitlines(keepends=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="run every case against a checkout, one file each")
    w.add_argument("outdir", type=Path)
    w.add_argument("--repo", type=Path, default=REPO,
                   help="the checkout to run (default: this one)")
    w.add_argument("--only", default="", help="only the cases whose path holds this")
    c = sub.add_parser("compare", help="byte-compare two corpora; exit 1 if any case differs")
    c.add_argument("dir_a", type=Path)
    c.add_argument("dir_b", type=Path)
    c.add_argument("--show", type=int, default=5, help="diffs to print")
    args = parser.parse_args(argv)
    if args.command == "write":
        return write(args.outdir, args.repo, args.only)
    return compare(args.dir_a, args.dir_b, args.show)


if __name__ == "__main__":
    sys.exit(main())
