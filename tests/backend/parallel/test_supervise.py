"""backend/parallel/supervise.py: a stop signal reaches the launcher's workers (not the launcher), the
exit status says whether they stopped cleanly, and the environment torchrun starts with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mkcode.backend.parallel.launch import NCCL_SAFE_ENV
from mkcode.backend.parallel.supervise import (
    RankLaunch,
    rank_environment,
    supervise,
    torchrun_command,
    worker_pids,
)
from mkcode.backend.parallel.torchrun import LAUNCHER_PID_ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")

# A stand-in for torchrun: two workers that record SIGTERM and exit 0 on it; the launcher itself
# ignores SIGTERM (so only a signal sent to the workers ends it) and exits with the workers' worst code.
WORKER = """
import signal, sys, time
from pathlib import Path
def term(signum, frame):
    Path(sys.argv[1]).write_text("term")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
Path(sys.argv[1] + ".ready").write_text("")
time.sleep(60)
sys.exit(3)
"""
LAUNCHER = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
kids = [subprocess.Popen([sys.executable, "-c", sys.argv[1], f"{sys.argv[2]}/w{i}"]) for i in range(2)]
sys.exit(max(k.wait() for k in kids))
"""


def _signal_when_ready(paths: list[Path], sig: int, handler_before) -> threading.Thread:
    def fire() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            all(p.exists() for p in paths) and signal.getsignal(sig) is not handler_before
        ):
            time.sleep(0.02)
        os.kill(os.getpid(), sig)

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    return t


def test_stop_signal_terminates_the_workers_and_returns_zero(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, WORKER, str(tmp_path)], start_new_session=True)
    try:
        ready = [tmp_path / "w0.ready", tmp_path / "w1.ready"]
        fired = _signal_when_ready(ready, signal.SIGTERM, before)
        lines: list[str] = []
        rc = supervise(proc, log=lines.append)
        fired.join(timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rc == 0
    assert lines == ["stopping the ranks…"]
    assert (tmp_path / "w0").read_text() == "term"
    assert (tmp_path / "w1").read_text() == "term"
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_exit_status_passes_through_without_a_stop() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(5)"])
    lines: list[str] = []
    assert supervise(proc, log=lines.append) == 5
    assert lines == []


def test_worker_pids_are_the_direct_children() -> None:
    code = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        assert worker_pids(proc.pid) == [child]
    finally:
        os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert worker_pids(proc.pid) == []  # reaped: no such process


def test_rank_environment_and_command() -> None:
    launch = RankLaunch(
        n=2, module="mkcode.app.cli", args=["serve", "--port", "9"], env={"MKCODE_API_KEY": "k"}
    )
    env = rank_environment(launch, base={"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"})
    assert env["PATH"] == "/bin"
    assert env["NCCL_NVLS_ENABLE"] == "1"  # a caller's own setting is kept
    for k, v in NCCL_SAFE_ENV.items():
        if k != "NCCL_NVLS_ENABLE":
            assert env[k] == v
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    assert env[LAUNCHER_PID_ENV] == str(os.getpid())
    assert env["MKCODE_API_KEY"] == "k"
    cmd = torchrun_command(launch)
    assert cmd[1:] == [
        "-m",
        "mkcode.backend.parallel.torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "mkcode.app.cli",
        "serve",
        "--port",
        "9",
    ]
