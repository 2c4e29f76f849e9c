"""What a change costs in a checkout: the before -> after numbers of issue 23 (the seams).

    python benchmarks/seam_counts.py [REPO ...]      # default: this repository

For each checkout it prints:
- files spelling `loss_chunks` (code, tests, benchmarks, README): what one knob touched;
- files outside a model family's folder (training/models/<family>/) that spell a Llama
  submodule name (wq, w1, feed_forward, tok_embeddings, ...);
- cluster-kind string branches in launcher/ and sweeps/ (`cluster.kind == "slurm"` and the like);
- memory implementations in the cost model (a module that sums per-rank memory);
- flat .py files directly in launcher/;
- lines of Python per package.
These are greps, not proofs: read the lines they count before trusting a number.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGES = ("conf", "parallel", "training", "launcher", "sweeps", "tests", "benchmarks")
SOURCE = PACKAGES[:5]
FAMILY_NAMES = re.compile(
    r"\b(wq|wk|wv|wo|w1|w2|w3|feed_forward|tok_embeddings|attention_norm|ffn_norm)\b")
KIND_BRANCH = re.compile(r"""(cluster\.kind|\bkind)\s*(==|!=|not in|in)\s*[("']*(local|slurm|nodes)\b"""
                         r"""|["'](local|slurm|nodes)["']\s*(==|!=)\s*\w*\.?kind""")
MEMORY_SUMS = re.compile(r"^(def estimate_memory|class MemoryTable)\b", re.M)
"""The entry points that sum a rank's memory: memory.py's and search_memory.py's mirror."""


def python_files(repo: Path, packages: tuple[str, ...]) -> list[Path]:
    return sorted(p for pkg in packages for p in (repo / pkg).rglob("*.py")
                  if "__pycache__" not in p.parts)


def files_matching(files: list[Path], pattern: re.Pattern) -> list[Path]:
    return [p for p in files if pattern.search(p.read_text(errors="replace"))]


def knob_files(repo: Path) -> int:
    files = python_files(repo, PACKAGES) + [repo / "README.md"]
    return len([p for p in files if p.is_file() and p.name != Path(__file__).name
                and "loss_chunks" in p.read_text()])


def family_spellers(repo: Path) -> list[str]:
    inside = repo / "training" / "models"
    outside = [p for p in python_files(repo, SOURCE) if inside not in p.parents]
    return [str(p.relative_to(repo)) for p in files_matching(outside, FAMILY_NAMES)]


def kind_branches(repo: Path) -> int:
    lines = (line for p in python_files(repo, ("launcher", "sweeps"))
             for line in p.read_text().splitlines())
    return sum(1 for line in lines if KIND_BRANCH.search(line)
               and "tiktoken" not in line and "interval" not in line)


def memory_models(repo: Path) -> int:
    files = python_files(repo, ("parallel",))
    return sum(len(MEMORY_SUMS.findall(p.read_text())) for p in files)


def report(repo: Path) -> None:
    print(f"== {repo}")
    print(f"files spelling loss_chunks:            {knob_files(repo)}")
    spellers = family_spellers(repo)
    print(f"family names outside the family folder: {len(spellers)} {' '.join(spellers)}")
    print(f"cluster-kind string branches:           {kind_branches(repo)}")
    print(f"memory implementations (entry sums):    {memory_models(repo)}")
    print(f"flat .py files in launcher/:            {len(list((repo / 'launcher').glob('*.py')))}")
    for pkg in PACKAGES:
        files = python_files(repo, (pkg,))
        lines = sum(len(p.read_text().splitlines()) for p in files)
        print(f"  {pkg:<11} {len(files):>4} files {lines:>6} lines")


def main(argv: list[str]) -> int:
    repos = [Path(a).resolve() for a in argv] or [Path(__file__).resolve().parents[1]]
    for repo in repos:
        report(repo)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
