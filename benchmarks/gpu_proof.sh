#!/usr/bin/env bash
# The one command a session lent an nvidia-h200 runs (see benchmarks/gpu_proof.py's docstring):
#   run(command="bash benchmarks/gpu_proof.sh", timeout_s=480, carry=[".whl"])
# after `bash benchmarks/gpu_wheels.sh` here. Installs the carried wheels (.whl/: hydra-core,
# omegaconf, antlr4-python3-runtime, submitit; the device image lacks them) into /tmp/site, then
# runs gpu_proof.py under a hard `timeout` a little past its own --budget-s. Extra arguments go to
# gpu_proof.py (e.g. --only compile --budget-s 240, --only moe). Results: stdout and $OUT/gpu_proof.{md,json}.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
"$PY" -c 'import hydra, omegaconf, torch; print("hydra", hydra.__version__, "omegaconf",
omegaconf.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())' || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
BUDGET=420; prev=""
for a in "$@"; do [[ $prev == --budget-s ]] && BUDGET=$a; prev=$a; done
timeout -k 10 $(( ${BUDGET%.*} + 30 )) "$PY" benchmarks/gpu_proof.py "$@"
