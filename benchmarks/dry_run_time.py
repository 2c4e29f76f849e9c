"""Wall time of `meshrun run --dry-run` (a fresh process each time): median of N runs.

    .venv/bin/python benchmarks/dry_run_time.py [N] [overrides...]
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def time_once(overrides: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "launcher.cli", "run", "--dry-run", *overrides],
                   cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    overrides = sys.argv[2:]
    time_once(overrides)  # warm the file cache and .pyc files
    times = [time_once(overrides) for _ in range(n)]
    print(f"dry run wall time over {n} runs: median {statistics.median(times):.3f} s "
          f"(min {min(times):.3f}, max {max(times):.3f})")


if __name__ == "__main__":
    main()
