#!/bin/bash
# One device-tool call: build the extension, run the GPU tests, benchmark, (optionally) sanitize.
# Usage (from the repo root, on the GPU machine):
#   bash backend/megakernel/gpu_run.sh [tests|runtime|bench|decode|san|probe]...  (decode: DECODE_BATCHES, default 1,8, DECODE_CTX, default 8192;
#                                                probe: PROBE=moe_probe PROBE_ARGS=prep, a csrc/probes program;
#                                                probe alone builds no extension)
#   bash backend/megakernel/gpu_run.sh plan      # = tests bench decode in one device call
#   bash backend/megakernel/gpu_run.sh split     # tests, the hybrid's split by context
#   bash backend/megakernel/gpu_run.sh groups    # the grouped layer's tests, BS 1 per grouping, layer_probe
#   PADS="0 65536" bash backend/megakernel/gpu_run.sh smem  # BS 1 with that much more shared memory (L1 cost)
#   bash backend/megakernel/gpu_run.sh ab        # harness on ab_base/ (ab_tree.sh REV) and on this tree, twice
#   bash backend/megakernel/gpu_run.sh abbench   # the same with gpu_check bench (faster: no graph backend)
#   TREES="ab_x ab_y" bash backend/megakernel/gpu_run.sh trees  # gpu_check bench here and on each tree
#                                                # (ab_tree.sh REV ab_x), ROUNDS (2) times in turn
# Every stage has a time cap (T_TESTS, T_BENCH, T_DECODE, T_SAN seconds; san: SAN_TOOL, SAN_ARGS such as
# "--mode 64") and writes under $OUT;
# partial results survive a cap (bench.json is rewritten after every run).
set -u
OUT=${OUT:-/tmp/mk_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MKCODE_KERNEL_CACHE=${MKCODE_KERNEL_CACHE:-$PWD/.mkcache}
export PYTHONPATH=/tmp/mkpp:${PYTHONPATH:-}
# the image's python3 has torch; expose this checkout as the mkcode package (app/, backend/, tools/)
mkdir -p /tmp/mkpp/mkcode && for d in app backend tools; do ln -sfn "$PWD/$d" /tmp/mkpp/mkcode/$d; done
touch /tmp/mkpp/mkcode/__init__.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
only_probe=1; for s in "$@"; do [[ $s == probe ]] || only_probe=0; done  # a probe needs no extension
if [[ $only_probe == 0 ]]; then
python3 -c "from mkcode.backend.megakernel.build import build; r = build(); print('build', r.path, 'cached' if r.cached else f'{r.seconds:.0f}s'); print(r.log[-3000:])" 2>&1 | tee "$OUT/build.log" || exit 1
echo "build done at +$(( $(date +%s) - t0 ))s"
fi
stages=("$@")
[[ ${#stages[@]} -eq 1 && ${stages[0]} == plan ]] && stages=(tests bench decode)
# megakernel variants timed by gpu_check (in order; each batch size runs on the engine's tiling for
# it, tiling_for_batch, with the variant's keys on top; an unset prefetch takes the fastest so far):
#   prefetch=0  the default, twice (the spread between runs of one call)
VARIANTS=${VARIANTS:-"prefetch=0 prefetch=0"}
# same-call A/B: STAGE on each tree in turn (. = this one, "A work"; an ab_* folder made by
# backend/megakernel/ab_tree.sh REV DIR, "B DIR REV"), ROUNDS (2) times (between calls the harness
# varied by up to ~6 %); the lines matching PATTERN, into NAME.log. Each tree runs its own
# gpu_run.sh, so an older tree needs only the stage.
tree_rounds() {
  local stage=$1 pattern=$2 name=$3 tree label
  shift 3
  for tree in "$@"; do
    [[ $tree == . || -f $tree/REV ]] || { echo "$name: no $tree/ (run backend/megakernel/ab_tree.sh REV $tree first)"; return; }
  done
  for round in $(seq "${ROUNDS:-2}"); do
    for tree in "$@"; do
      if [[ $tree == . ]]; then label="A work"; else label="B $tree $(cut -d' ' -f1 "$tree/REV")"; fi
      (cd "$tree" && MKCODE_KERNEL_CACHE=$PWD/.mkcache OUT=$OUT/$name/${label// /_}$round \
        bash backend/megakernel/gpu_run.sh "$stage" 2>&1 | grep -E "$pattern" | sed "s|^|$label |")
      # the device tool returns a limited number of files: keep each run's results (bench.json,
      # decode JSON, logs), drop its timelines, build logs and plots (the timeline of this tree
      # comes from a separate `bench` stage)
      find "$OUT/$name/${label// /_}$round" \( -name "timeline_*.pt" -o -name build.log -o -name gpu.txt \
        -o -name "*.png" \) -delete 2>/dev/null || true
    done
  done 2>&1 | tee "$OUT/$name.log"
}
for stage in "${stages[@]}"; do
  case $stage in
    runtime)  # the product path (checkpoint -> runtime -> engine) on each decode backend, hybrid included
      timeout ${T_RT:-300} python3 -m pytest tests/backend/test_runtime_gpu.py -m gpu -q -s -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/runtime.log" | grep -E "^\[|passed|failed|Error" | tail -30 ;;
    tests)
      timeout ${T_TESTS:-160} python3 -m pytest tests/backend/megakernel/test_gpu.py -m gpu -q --maxfail=12 -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/pytest.log" | tail -40 ;;
    bench)
      timeout ${T_BENCH:-130} python3 -m mkcode.backend.megakernel.gpu_check bench --out "$OUT" --batches ${BATCHES:-1 8} --context ${CONTEXT:-8192} --variants $VARIANTS ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" ;;
    decode)  # the engine's bench harness: graph vs megakernel, one run
      timeout ${T_DECODE:-70} python3 -m mkcode.app.cli bench decode --backend graph,megakernel --batch ${DECODE_BATCHES:-1,8} --ctx ${DECODE_CTX:-8192} \
        --steps ${STEPS:-30} --out "$OUT/decode" 2>&1 | tee "$OUT/decode.log" | tail -20 ;;
    ab)  # the engine harness on ab_base/ and this tree, the same cap for both
      T_DECODE=${T_DECODE:-100} tree_rounds decode "B=[18] " ab ab_base . ;;
    trees)  # gpu_check bench (VARIANTS) on this tree and on each ab_* tree in TREES
      tree_rounds bench "^BS [0-9]+ ctx|rror" trees . ${TREES:-} ;;
    abbench)  # gpu_check bench on ab_base/ and this tree (each batch size on its default tiling)
      VARIANTS=prefetch=0 tree_rounds bench "^BS [0-9]+ ctx" abbench ab_base . ;;
    probe)  # a stand-alone probe (csrc/probes; PROBE, default moe_probe) with its arguments (PROBE_ARGS, default
      # prep; several runs: PROBE_ARGS="smoke geom", each under T_PROBE); ptxas -v into $OUT/$probe.ptxas
      probe=${PROBE:-moe_probe}
      nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v "csrc/probes/$probe.cu" -o "/tmp/$probe" \
        > "$OUT/$probe.ptxas" 2>&1 && grep -E "Compiling entry|registers|spill" "$OUT/$probe.ptxas" | sed "s/ptxas info    : //" &&
        for arg in ${PROBE_ARGS:-prep}; do
          timeout ${T_PROBE:-120} "/tmp/$probe" "$arg" 2>&1 | tee -a "$OUT/$probe.log"
          rc=${PIPESTATUS[0]}; echo "$probe $arg: exit $rc"; [[ $rc == 0 ]] || break
        done ;;
    split)  # the GPU tests and the hybrid's split in one stage (~130 s, H100)
      T_TESTS=${T_TESTS:-120} bash "$0" tests | tail -8
      # the hybrid's split (backend/engine/hybrid_backend.py): graph vs megakernel by rows and context, twice
      for round in 1 2; do
        DECODE_BATCHES=1 DECODE_CTX=256,1024,2048,8192,65536,131072,262144 T_DECODE=${T_DECODE:-120} \
          STEPS=20 OUT=$OUT/sweep$round bash "$0" decode | grep -E "B=|rror"
        DECODE_BATCHES=2 DECODE_CTX=8192,131072 T_DECODE=${T_DECODE:-60} STEPS=20 \
          OUT=$OUT/pair$round bash "$0" decode | grep -E "B=|rror"
      done
      # what comes back (the device tool returns at most 8 files): the decode JSONs (the tests' summary
      # is in the output)
      rm -f "$OUT"/{build.log,gpu.txt,pytest.log}
      rm -f "$OUT"/{sweep1,sweep2,pair1,pair2}/{build.log,gpu.txt,decode.log}
      find "$OUT" -name "*.png" -delete ;;
    groups)  # the grouped layer (docs/MEGAKERNEL.md): its GPU tests first; layer_probe's gate lines (one
      # op per layer, as tasks, flat mma); then BS 1 at 8K on each grouping (Tiling.moe_group /
      # attn_group / 96-column items) against the default, in turn, with the timeline of TL_VARIANT
      # (~7 min in all: the device tool's 10-minute cap; the sanitizer on a grouped step is a call of
      # its own: SAN_ARGS="--contexts 300 --tiling moe_group=4,attn_group=16" gpu_run.sh san)
      PYTEST_K=${PYTEST_K:-"group or 96 or QKV"} T_TESTS=${T_TESTS:-200} bash "$0" tests | tail -6
      PROBE=layer_probe PROBE_ARGS=run T_PROBE=${T_PROBE:-90} bash "$0" probe | grep -E "mma|rror|exit"
      g=moe_group=16,attn_group=16
      BATCHES=1 T_BENCH=${T_BENCH:-260} BENCH_ARGS="--timeline-variant ${TL_VARIANT:-$g}" \
        VARIANTS=${GROUP_VARIANTS:-"prefetch=0 moe_group=16 attn_group=16 $g moe_up_cols=96,$g prefetch=0 $g"} \
        bash "$0" bench | grep -vE "^build|done at" ;;
    smem)  # the L1 share's cost: the bench stage at BS 1 with MKCODE_MK_SMEM_PAD bytes more shared memory
      # (the kernel reads the pad once per process), each pad of PADS in turn
      for pad in ${PADS:-0 65536 98304 0 65536 98304}; do
        MKCODE_MK_SMEM_PAD=$pad BATCHES=${BATCHES:-1} VARIANTS=prefetch=0 T_BENCH=${T_BENCH:-90} OUT=$OUT/pad$pad \
          bash "$0" bench | grep -E "^BS [0-9]+ ctx|rror" | sed "s/^/pad $pad /"
      done
      find "$OUT" \( -name "timeline_*.pt" -o -name build.log -o -name gpu.txt \) -delete ;;
    san)  # compute-sanitizer (SAN_TOOL) on the reduced step at three rows, then at one row (the
      # product's self-routing path, on the SMs it needs: gpu_check step_sms), or SAN_ARGS alone
      if [[ -n ${SAN_ARGS:-} ]]; then runs=("$SAN_ARGS"); else runs=("" "--contexts 300"); fi
      for a in "${runs[@]}"; do
        timeout ${T_SAN:-150} compute-sanitizer --tool ${SAN_TOOL:-memcheck} --print-limit 20 \
          python3 -m mkcode.backend.megakernel.gpu_check sanitize $a 2>&1 | tee -a "$OUT/sanitize.log" | tail -25
      done ;;
  esac
  echo "$stage done at +$(( $(date +%s) - t0 ))s"
done
