#!/usr/bin/env bash
# One device call: GPU tests, then the benchmarks; logs and reports under $OUT.
# Usage (repo root, on the GPU machine): bash devtools/bench/run_device.sh [tests|bench|all]
set -o pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/shim/mkcode
for f in app backend tools; do ln -sfn "$PWD/$f" /tmp/shim/mkcode/$f; done
export PYTHONPATH=/tmp/shim${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}
what=${1:-all}
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [[ $what == tests || $what == all ]]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest tests/backend/gpu -m gpu -q -s -x -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
fi
if [[ $what == bench || $what == all ]]; then
  timeout ${BENCH_TIMEOUT:-200} python3 -m mkcode.app.cli bench decode --backend graph,torch,megakernel \
    --batch ${BATCHES:-1,2,4,8} --ctx ${CTXS:-1024,8192,32768,131072,262144} --steps ${STEPS:-30} \
    --routing ${ROUTING:-uniform} ${HF:+--hf-reference} --out "$OUT" 2>&1 | tee "$OUT/bench_decode.log"
  [[ -n $PREFILL ]] && timeout 120 python3 -m mkcode.app.cli bench prefill --out "$OUT" 2>&1 | tee "$OUT/bench_prefill.log"
fi
exit 0
