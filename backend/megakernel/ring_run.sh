#!/bin/bash
# One device-tool call for engine v2's weight ring (issue 41 step 2, MK_MODE_RING = prefetch bit 8):
# correctness of the ring kernel first, then the old and the new path timed in the same call. The ring
# kernel's backends carry tensor maps (tensor_maps.py): K-range tiles stream as TMA boxes.
# Usage (repo root, GPU machine): bash backend/megakernel/ring_run.sh [step] [tests] [bench] [l1] [release]
#   step     the ring kernel (MKCODE_MK_RING=1): one reduced 2-layer step in ring mode vs the fp32
#            reference (gpu_check step --mode 8); a failure stops the call
#   tests    tests/backend/megakernel/test_gpu_ring.py without the release geometry (T_TESTS s): every
#            GEMV op (whole rows and K-range boxes) with the exact stage count its plan streams
#   bench    gpu_check bench at BS 1 (BATCHES), ctx 8K: the default kernel (the reference path,
#            prefetch=0 twice), then the ring kernel (prefetch=0, 8, 8: its register path, the ring),
#            each line with tok/s and % of SOL; the ring kernel's timeline (--timeline-mode TL_MODE,
#            default 8); RING_VARIANTS replaces the ring kernel's variant list
#   l1       what the ring's shared memory costs the register paths: the default kernel and the ring
#            kernel's register path (prefetch=0), each without and with MKCODE_MK_SMEM_PAD = the
#            ring's bytes (RING_PAD, default RING_BYTES + MK_TMAP_SMEM_ALIGN from the headers: the same L1 share as
#            ring mode; the default kernel also with 64 KB), each with its timeline (one process per
#            pad: the kernel reads it once)
#   release  the ring tests at the release geometry (8K, BS 1 and 8)
# Logs under $OUT (ptxas.txt, step.log, tests.log, bench_default/, bench_ring/, l1_*, release.log).
set -u
OUT=${OUT:-/tmp/mk_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MKCODE_KERNEL_CACHE=${MKCODE_KERNEL_CACHE:-$PWD/.mkcache}
export PYTHONPATH=/tmp/mkpp:${PYTHONPATH:-}
mkdir -p /tmp/mkpp/mkcode && for d in app backend tools; do ln -sfn "$PWD/$d" /tmp/mkpp/mkcode/$d; done
touch /tmp/mkpp/mkcode/__init__.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
build() {  # $1: 0 default kernel, 1 ring kernel
  MKCODE_MK_RING=$1 python3 -c "from mkcode.backend.megakernel.build import build; r = build(); print('build', r.path, 'cached' if r.cached else f'{r.seconds:.0f}s')" 2>&1 | tee -a "$OUT/build.log"
}
build 1 || exit 1
build 0 || exit 1
echo "builds done at +$(( $(date +%s) - t0 ))s"
for f in "$MKCODE_KERNEL_CACHE"/*/mk_kernel.o.log; do  # registers / stack / spills of both kernels
  { grep -o -- "-DMK_RING=1" "$f" | head -1 || true; grep -A2 "Function properties for _ZN2mk14mk_step_kernel" "$f"; } >> "$OUT/ptxas.txt"
done
for stage in "$@"; do
  case $stage in
    step)
      MKCODE_MK_RING=1 timeout ${T_STEP:-90} python3 -m mkcode.backend.megakernel.gpu_check step --mode 8 2>&1 | tee "$OUT/step.log" | tail -4
      [[ ${PIPESTATUS[0]} == 0 ]] || { echo "ring step failed: stop"; exit 1; } ;;
    tests)
      MKCODE_MK_RING=1 timeout ${T_TESTS:-320} python3 -m pytest tests/backend/megakernel/test_gpu_ring.py -m gpu -q -x \
        -p no:cacheprovider -k "not release" 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    bench)
      MKCODE_MK_RING=0 timeout ${T_BENCH:-150} python3 -m mkcode.backend.megakernel.gpu_check bench --out "$OUT/bench_default" \
        --batches ${BATCHES:-1} --context 8192 --variants prefetch=0 prefetch=0 2>&1 | tee "$OUT/bench_default.log" | grep -E "^BS|copy|rror"
      MKCODE_MK_RING=1 timeout ${T_BENCH:-150} python3 -m mkcode.backend.megakernel.gpu_check bench --out "$OUT/bench_ring" \
        --batches ${BATCHES:-1} --context 8192 --variants ${RING_VARIANTS:-prefetch=0 prefetch=8 prefetch=8} --timeline-mode ${TL_MODE:-8} \
        2>&1 | tee "$OUT/bench_ring.log" | grep -E "^BS|check|copy|rror|MOE|QKV|LM_HEAD|ROUTER|OPROJ|ATTN |span" ;;
    l1)
      rp=${RING_PAD:-$(python3 -c "from mkcode.backend.megakernel import abi, ring_model as r; print(r.RING_D * r.RING_STAGE + abi.MK_TMAP_SMEM_ALIGN)")}
      for kp in 0:0 0:65536 0:$rp 1:0 1:$rp; do
        k=${kp%%:*} pad=${kp#*:}
        MKCODE_MK_RING=$k MKCODE_MK_SMEM_PAD=$pad timeout ${T_BENCH:-150} python3 -m mkcode.backend.megakernel.gpu_check bench \
          --out "$OUT/l1_k${k}_p$pad" --batches ${BATCHES:-1} --context 8192 --variants prefetch=0 prefetch=0 --timeline-mode 0 \
          2>&1 | tee "$OUT/l1_k${k}_p$pad.log" | grep -E "^BS|rror|^  [A-Z_]+\*? +n=|SM time"
      done ;;
    release)
      MKCODE_MK_RING=1 timeout ${T_REL:-200} python3 -m pytest tests/backend/megakernel/test_gpu_ring.py -m gpu -q \
        -p no:cacheprovider -k release 2>&1 | tee "$OUT/release.log" | tail -8 ;;
  esac
  echo "$stage done at +$(( $(date +%s) - t0 ))s"
done
