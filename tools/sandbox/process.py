"""Run one process with a wall-time limit, a capped output buffer and a kill of its whole tree."""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psutil

from mkcode.tools.sandbox.disk import DiskUse, DiskWatch

# How long to keep reading after the main process exited (background children holding the pipe).
_DRAIN_GRACE_S = 0.5


@dataclass(frozen=True)
class ProcessOutcome:
    exit_code: int | None  # None when it did not exit by itself (killed by us)
    output: str  # stdout and stderr interleaved, capped, decoded with replacement characters
    output_bytes: int  # total bytes the process wrote
    truncated: bool
    timed_out: bool
    flooded: bool  # stopped because it wrote more than the flood limit
    cancelled: bool
    duration_s: float
    disk: DiskUse | None = None  # what the disk watcher saw; disk.exceeded: stopped by the disk budget

    @property
    def disk_exceeded(self) -> bool:
        return self.disk is not None and self.disk.exceeded is not None


class _CappedBuffer:
    """Keeps the first and last `limit/2` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> tuple[str, bool]:
        if len(self.tail) > self.half:
            del self.tail[: len(self.tail) - self.half]
        dropped = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if dropped <= 0:
            return head + tail, False
        return f"{head}\n[... output truncated: {dropped} bytes omitted ...]\n{tail}", True


def _descendants(root_pid: int) -> list[int]:
    """All live descendants of root_pid (psutil walks the process table)."""
    try:
        return [child.pid for child in psutil.Process(root_pid).children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Has it exited? Checked without reaping it, so its pid stays reserved until proc.wait()."""
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process, its process group, and every descendant still attached to it."""
    for _ in range(5):
        pids = _descendants(proc.pid)
        for pid in pids:  # freeze first so a fork loop cannot outrun the kill
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            break


def run_captured(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout_s: float,
    output_chars: int,
    flood_bytes: int,
    cancel: threading.Event | None = None,
    disk: DiskWatch | None = None,
) -> ProcessOutcome:
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout must be a finite number of seconds greater than 0, not {timeout_s!r}")
    start = time.monotonic()
    deadline = start + timeout_s
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, killed as a whole
        close_fds=True,
    )
    if disk is not None:
        disk.start(lambda: _stop_now(proc))
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    buf = _CappedBuffer(output_chars)
    timed_out = flooded = cancelled = eof = False
    exited_at: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and _exited(proc):
                exited_at = now
            if exited_at is not None and (eof or now - exited_at > _DRAIN_GRACE_S):
                break  # done; anything in the background still holding the pipe is killed below
            if now >= deadline:
                timed_out = True
                break
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if disk is not None and disk.exceeded:
                break
            wait = min(0.1, max(deadline - now, 0))
            if eof:  # output closed but the process lives on: just wait for it
                time.sleep(min(wait, 0.02))
                continue
            if not sel.select(timeout=wait):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                eof = True
                sel.unregister(fd)
                continue
            buf.add(chunk)
            if buf.total > flood_bytes:
                flooded = True
                break
    killed = not _exited(proc)
    kill_tree(proc)  # before reaping: the pid (and so the process group id) cannot be reused yet
    disk_use = disk.stop() if disk is not None else None
    if disk_use is not None and disk_use.exceeded:
        killed = True  # the watcher's kill, not an exit of its own
    proc.wait()
    proc.stdout.close()
    text, truncated = buf.text()
    return ProcessOutcome(
        exit_code=None if killed else proc.returncode,
        output=text,
        output_bytes=buf.total,
        truncated=truncated or flooded,
        timed_out=timed_out and killed,
        flooded=flooded,
        cancelled=cancelled,
        duration_s=time.monotonic() - start,
        disk=disk_use,
    )


def _stop_now(proc: subprocess.Popen[bytes]) -> None:
    """The disk watcher's kill: the process group at once (bwrap with it, and so its whole PID
    namespace), then every descendant. Runs on the watcher's thread; the pid is not reaped yet."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    kill_tree(proc)
