"""Supervision of N ranks under torchrun, for a command typed directly (`mkcode serve
--tensor-parallel N`): start torchrun in a session of its own, wait for it, and stop the ranks in
order on Ctrl+C / SIGTERM / SIGHUP.

torchrun runs in a new session so a terminal's Ctrl+C reaches only the launcher; the launcher then
sends SIGTERM to torchrun's workers (rank 0 shuts its server down and releases the other ranks).
Should the ranks not be gone a minute later, torchrun itself gets SIGTERM (it terminates the
workers, then kills them after its grace period). `mkcode.backend.parallel.torchrun` makes torchrun
die with the launcher should the launcher itself be killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from mkcode.backend.parallel.launch import NCCL_SAFE_ENV
from mkcode.backend.parallel.torchrun import LAUNCHER_PID_ENV

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
ESCALATE_AFTER_S = 60.0  # ranks still running this long after a stop request: torchrun gets SIGTERM


@dataclass(frozen=True)
class RankLaunch:
    """What to run as each rank: `python -m <module> *args` under `torchrun --nproc-per-node n`."""

    n: int
    module: str
    args: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)  # added to this process's environment


def torchrun_command(launch: RankLaunch) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mkcode.backend.parallel.torchrun",
        "--standalone",
        "--nproc-per-node",
        str(launch.n),
        "-m",
        launch.module,
        *launch.args,
    ]


def rank_environment(launch: RankLaunch, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun starts with: NCCL safety defaults, one share of the CPU cores per
    rank for OpenMP (unless set), this process's pid (torchrun exits should it be gone already),
    then the launch's own variables."""
    env = dict(os.environ if base is None else base)
    for k, v in NCCL_SAFE_ENV.items():
        env.setdefault(k, v)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // launch.n)))
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    env.update(launch.env)
    return env


def worker_pids(pid: int) -> list[int]:
    """The direct children of `pid` (torchrun's workers: the ranks)."""
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def run_ranks(launch: RankLaunch, *, log: Callable[[str], None]) -> int:
    """Start the ranks under torchrun and supervise them until torchrun exits (see `supervise`)."""
    proc = subprocess.Popen(torchrun_command(launch), env=rank_environment(launch), start_new_session=True)
    return supervise(proc, log=log)


def supervise(proc: subprocess.Popen, *, log: Callable[[str], None]) -> int:
    """Wait for a launcher process; a stop signal sends its workers SIGTERM (the launcher itself
    when it has none yet), and the launcher after ESCALATE_AFTER_S more. Returns its exit status;
    0 when a stop signal asked the ranks to stop and they did so cleanly. Installs handlers for
    STOP_SIGNALS (main thread only) and restores the previous ones on return."""
    stopping: list[float] = []

    def stop(signum: int, frame: object) -> None:
        if stopping:
            return  # torchrun kills what is left after its grace period
        stopping.append(time.monotonic())
        log("stopping the ranks…")
        workers = worker_pids(proc.pid)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if not workers:
            proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        while True:
            try:
                rc = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > ESCALATE_AFTER_S:
                    proc.send_signal(signal.SIGTERM)  # torchrun: SIGTERM the ranks, then SIGKILL
                    stopping[0] = float("inf")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 0 if stopping and rc == 0 else rc
