#!/bin/bash
# One device call: retrain the demo model on one GPU with several tool vocabularies in its data
# (`--tool-sets mixed`: mkcode's registry, OpenCode's and Codex CLI's tools, random renamings; see
# vocabularies.py), so that it calls whatever tools a client sends.
# Usage (repo root on the GPU machine; carry .whl/ holding wheels of bracex and wcmatch, which the
# device image lacks; the run tool's $OUT comes back):
#   bash backend/demo/gpu_retrain.sh
# Settings (environment): STEPS (default 2000: the shipped 900 took 197 s on an H100, and a step
# of mixed tool sets costs as many tokens as a default one), MAX_SECONDS (default 450: training stops
# there, recorded in demo_report.json), STOP_AFTER (stop after this many steps of the STEPS schedule:
# the shipped demo model 4 is STEPS=2400 STOP_AFTER=2341), INIT_FROM (a demo checkpoint directory to
# continue from, e.g. backend/demo/checkpoint: the shipped model), SEED (0), TOOL_SETS (mixed), DEVICE (cuda), BATCH_SIZE (the
# trainer's 48), PY (python3: the image's holds PyTorch).
# Writes four files under $OUT (the run tool brings back at most 8): gpu.txt, train.log,
# demo_report.json and checkpoint.tgz (the directory `checkpoint/`: weights, tokenizer, VERSION,
# SHA256SUMS, demo_report.json). The held-out evaluation runs shell commands through mkcode's
# sandbox, which the device lacks: evaluate on a CPU machine afterwards with
#   python -m mkcode.backend.demo.evaluate DIR --tool-set mkcode opencode codex --report DIR/REPORT.md
# A CPU smoke of this script: OUT=/tmp/x DEVICE=cpu STEPS=2 BATCH_SIZE=4 PY=.venv/bin/python bash ...
set -o pipefail
OUT=${OUT:-/tmp/demo_out}
mkdir -p "$OUT"
PY=${PY:-python3}
SITE=${SITE:-/tmp/mkcode-demo-site}
if ! "$PY" -c "import wcmatch, bracex" 2>/dev/null; then  # the device image lacks them
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
fi
mkdir -p "$SITE/mkcode" && for d in app backend tools; do ln -sfn "$PWD/$d" "$SITE/mkcode/$d"; done
[ -e "$SITE/mkcode"/__init__.py ] || touch "$SITE/mkcode"/__init__.py
export PYTHONPATH="$SITE":${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"; } | tee "$OUT/gpu.txt"
WORK=$(mktemp -d)
t0=$(date +%s)
"$PY" -m mkcode.backend.demo.trainer --out "$WORK/checkpoint" --device "${DEVICE:-cuda}" \
  --tool-sets "${TOOL_SETS:-mixed}" --steps "${STEPS:-2000}" --seed "${SEED:-0}" \
  --max-seconds "${MAX_SECONDS:-450}" ${STOP_AFTER:+--stop-after "$STOP_AFTER"} ${INIT_FROM:+--init-from "$INIT_FROM"} ${BATCH_SIZE:+--batch-size "$BATCH_SIZE"} --no-eval 2>&1 | tee "$OUT/train.log"
rc=$?
echo "trainer exit $rc after $(( $(date +%s) - t0 ))s"
if [ -d "$WORK/checkpoint" ]; then
  cp "$WORK/checkpoint/demo_report.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/checkpoint.tgz" -C "$WORK" checkpoint && ls -l "$OUT"
  rm -rf "$WORK"
fi
exit $rc
