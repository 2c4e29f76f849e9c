#!/usr/bin/env bash
# Downloads, into .whl/ at the repository root, the Python packages that meshrun's run path needs
# and the nvidia-h200 device image lacks (KINDS.md's package list: it already has torch, PyYAML,
# rich, markdown-it-py, mdurl, pygments, cloudpickle, typing-extensions, safetensors, packaging,
# numpy, matplotlib, pytest). Missing there: hydra-core, omegaconf, antlr4-python3-runtime
# (compose), submitit (imported only by the Slurm path; small, carried so `import submitit` in
# any test works). wandb is NOT carried: training imports it lazily, only when logging is on, and
# benchmarks/gpu_proof.py runs with logging=disabled.
#
# Versions match this project's pins (pyproject.toml) and the dev venv: hydra-core 1.3.8,
# omegaconf 2.3.1, antlr4-python3-runtime 4.9.3 (omegaconf 2.3 needs exactly 4.9.*; PyPI has
# only an sdist for it, so it is built into a pure-Python wheel here), submitit 1.5.4.
# All are pure Python (py3-none-any), so the platform flags only matter for pip's resolver.
#
# Run once here, from anywhere:   bash benchmarks/gpu_wheels.sh
# It also adds /.whl/ to .git/info/exclude (the device README's way: ignored, travels via carry).
# Then the device call is (see benchmarks/gpu_proof.py's docstring):
#   run(command="bash benchmarks/gpu_proof.sh", timeout_s=540, carry=[".whl"])
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
cd "$ROOT"
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
rm -rf .whl && mkdir -p .whl
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" -d .whl hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4
# antlr4-python3-runtime 4.9.3 exists only as an sdist: build a pure-Python wheel of it here.
"$PY" -m pip wheel -q --no-deps --no-binary=:all: -w .whl antlr4-python3-runtime==4.9.3
ls -l .whl
du -ch .whl/*.whl | tail -1
for w in .whl/*.whl; do  # each wheel's needs, for a check against KINDS.md's list
  echo "$(basename "$w"): $(unzip -p "$w" '*/METADATA' | grep ^Requires-Dist | grep -v extra \
    | sed 's/Requires-Dist: //' | tr '\n' ';')"
done
