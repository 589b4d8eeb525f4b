"""devtools.parallel.gpu_bench's smoke mode: two CPU ranks (gloo) on the reduced geometry, the
parallel logits checked against the single-rank run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_cpu_ranks_match_one(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [
        "-m",
        "devtools.parallel.gpu_bench",
        "--tiny",
        "--batches",
        "1,2",
        "--steps",
        "2",
        "--warmup",
        "1",
    ]
    cmd += ["--ctx", "16", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((tmp_path / "bench_parallel.json").read_text())
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["world"] == 2 and r["tp"] == 2 and r["ep"] == 2
        assert r["ok"] and r["greedy_agree"] == 1.0 and r["min_cosine"] > 0.999
        assert r["collectives_per_step"] > 0 and r["ms_per_step_ngpu"] > 0
