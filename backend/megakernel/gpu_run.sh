#!/bin/bash
# One device-tool call: build the extension, run the GPU tests, benchmark, (optionally) sanitize.
# Usage (from the repo root, on the GPU machine): bash backend/megakernel/gpu_run.sh [tests|bench|san]...
set -u
OUT=${OUT:-/tmp/mk_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MKCODE_KERNEL_CACHE=${MKCODE_KERNEL_CACHE:-$PWD/.mkcache}
export PYTHONPATH=/tmp/mkpp:${PYTHONPATH:-}
# the image's python3 has torch; expose this checkout as the mkcode package (app/, backend/, tools/)
mkdir -p /tmp/mkpp/mkcode && for d in app backend tools; do ln -sfn "$PWD/$d" /tmp/mkpp/mkcode/$d; done
touch /tmp/mkpp/mkcode/__init__.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
python3 -c "from mkcode.backend.megakernel.build import build; r = build(); print('build', r.path, 'cached' if r.cached else f'{r.seconds:.0f}s'); print(r.log[-1500:])" 2>&1 | tee "$OUT/build.log" || exit 1
echo "build done at +$(( $(date +%s) - t0 ))s"
for stage in "$@"; do
  case $stage in
    tests) timeout ${T_TESTS:-240} python3 -m pytest tests/backend/megakernel/test_gpu.py -m gpu -q --maxfail=12 -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/pytest.log" | tail -40 ;;
    bench) timeout ${T_BENCH:-200} python3 -m mkcode.backend.megakernel.gpu_check bench --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" ;;
    san) timeout ${T_SAN:-150} compute-sanitizer --tool memcheck --print-limit 20 python3 -m mkcode.backend.megakernel.gpu_check sanitize 2>&1 | tee "$OUT/sanitize.log" | tail -25 ;;
  esac
  echo "$stage done at +$(( $(date +%s) - t0 ))s"
done
