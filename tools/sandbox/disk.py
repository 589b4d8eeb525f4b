"""A disk budget for one command: how much the workspace's filesystems may fill while it runs.

A watcher thread samples the free space (and free inodes) of every filesystem holding a workspace
root with statvfs, every 2 to 20 ms (faster as the budget fills), and stops the command the moment the drop since its start
exceeds the budget. statvfs sees every way of using space (write, mmap, fallocate, many small
files, metadata): ext4 and XFS count delayed-allocation reservations at write() time. It measures
the filesystem, not the command: space other programs use at the same time counts too (the error
says so), and space the command frees makes room for more (the budget is on the net growth).

The other layers: RLIMIT_FSIZE stops any single file at the budget exactly (limits.py), and the
sandbox's own tmpfs mounts (/tmp, the empty $HOME...) get a size cap (cap_tmpfs), since they live
in memory, not on the watched filesystems.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

# The watcher samples every MIN_SAMPLE_S when the budget is nearly used, every MAX_SAMPLE_S when it
# is far away: the interval is the time a writer at ASSUMED_RATE would need for a quarter of what is
# left, so the overshoot stays near a quarter of the headroom (or one short interval's writing).
MIN_SAMPLE_S = 0.002
MAX_SAMPLE_S = 0.02
ASSUMED_RATE = 10 * 1024**3  # bytes per second: page-cache writes on a fast machine
ASSUMED_FILE_RATE = 200_000  # files created per second
MAX_FILESYSTEMS = 64


@dataclass(frozen=True)
class DiskUse:
    """What the watcher saw: the largest growth of any watched filesystem during the command."""

    budget_bytes: int | None
    budget_files: int | None
    used_bytes: int  # drop in free space (bytes) since the start, at its largest
    used_files: int  # drop in free inodes since the start, at its largest
    exceeded: str | None  # None, "bytes" or "files"
    filesystems: int  # how many filesystems were watched

    def describe(self) -> str:
        if self.exceeded == "files":
            return (
                f"stopped: created more than {self.budget_files} files in the workspace "
                f"(disk budget; the workspace filesystem lost {self.used_files} inodes while it ran); "
                "the command and all its processes were killed"
            )
        return (
            f"stopped: wrote more than {human_bytes(self.budget_bytes or 0)} to the workspace "
            f"(disk budget; the workspace filesystem lost {human_bytes(self.used_bytes)} of free space while "
            "it ran, other programs' writes included); the command and all its processes were killed"
        )


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"


def _filesystems(paths: Sequence[str]) -> list[str]:
    """One path per distinct filesystem (st_dev) among `paths` and the mounts below them (a
    workspace bind is recursive: a filesystem mounted inside the workspace is writable too)."""
    seen: dict[int, str] = {}
    for p in [*paths, *_mounts_below(paths)]:
        try:
            seen.setdefault(os.stat(p).st_dev, p)
        except OSError:
            continue
        if len(seen) >= MAX_FILESYSTEMS:
            break
    return list(seen.values())


def _mounts_below(paths: Sequence[str]) -> list[str]:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    roots = [os.path.realpath(p).rstrip("/") + "/" for p in paths]
    found: list[str] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        # mountinfo escapes space, tab, newline and backslash as octal
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if any(point.startswith(r) for r in roots):
            found.append(point)
    return found


def _free(path: str) -> tuple[int, int, bool]:
    """(free bytes, free inodes, counts inodes?) of the filesystem holding path."""
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize, st.f_ffree, st.f_files > 0


class DiskWatch:
    """Samples the free space under `paths` from start() to stop(); calls `on_exceed` once, from its thread."""

    def __init__(
        self,
        paths: Sequence[str],
        budget_bytes: int | None,
        budget_files: int | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.budget_files = budget_files
        self._paths = _filesystems(paths) if (budget_bytes or budget_files) else []
        self._base: dict[str, tuple[int, int, bool]] = {}
        self._used_bytes = 0
        self._used_now = 0
        self._files_now = 0
        self._used_files = 0
        self._exceeded: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_exceed: Callable[[], None] | None = None

    @property
    def active(self) -> bool:
        return bool(self._paths)

    @property
    def exceeded(self) -> str | None:
        return self._exceeded

    def start(self, on_exceed: Callable[[], None]) -> None:
        if not self._paths:
            return
        self._on_exceed = on_exceed
        self._base = {p: _free(p) for p in self._paths}
        self._thread = threading.Thread(target=self._run, name="mkcode-disk-watch", daemon=True)
        self._thread.start()

    def _interval(self) -> float:
        wait = MAX_SAMPLE_S
        if self.budget_bytes:
            wait = min(wait, max(self.budget_bytes - self._used_now, 0) / ASSUMED_RATE / 4)
        if self.budget_files:
            wait = min(wait, max(self.budget_files - self._files_now, 0) / ASSUMED_FILE_RATE / 4)
        return max(MIN_SAMPLE_S, wait)

    def _sample(self) -> str | None:
        self._used_now = self._files_now = 0
        for p, (free0, inodes0, counts_inodes) in self._base.items():
            try:
                free, inodes, _ = _free(p)
            except OSError:
                continue
            self._used_now = max(self._used_now, free0 - free)
            self._used_bytes = max(self._used_bytes, free0 - free)
            if counts_inodes:
                self._files_now = max(self._files_now, inodes0 - inodes)
                self._used_files = max(self._used_files, inodes0 - inodes)
            if self.budget_bytes and free0 - free > self.budget_bytes:
                return "bytes"
            if self.budget_files and counts_inodes and inodes0 - inodes > self.budget_files:
                return "files"
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            hit = self._sample()
            if hit is not None:
                self._exceeded = hit
                assert self._on_exceed is not None
                self._on_exceed()
                return
            self._stop.wait(self._interval())

    def stop(self) -> DiskUse:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self._exceeded is None:
                self._sample()  # the last writes before the command exited
        return DiskUse(
            budget_bytes=self.budget_bytes,
            budget_files=self.budget_files,
            used_bytes=max(self._used_bytes, 0),
            used_files=max(self._used_files, 0),
            exceeded=self._exceeded,
            filesystems=len(self._paths),
        )


def cap_tmpfs(argv: Sequence[str], bwrap: str | None, size_bytes: int | None) -> list[str]:
    """`argv` with `--size N` before every `--tmpfs` of the bwrap command line in it.

    Every tmpfs the sandbox mounts (/tmp, /run, the empty $HOME, ...) is memory the command could
    fill; bwrap (0.10+) sets a size for the next --tmpfs. bwrap's own /dev (--dev) is a tmpfs
    without a size whose shm/ is writable, so a sized tmpfs is mounted over DEV/shm. Options are read as bwrap reads them, up
    to its `--`, so a path that happens to be spelled `--tmpfs` is never taken for the option.
    """
    out = list(argv)
    if not size_bytes or bwrap is None or not _bwrap_has_size(bwrap):
        return out
    try:
        i = out.index(bwrap) + 1
    except ValueError:
        return out
    while i < len(out) and out[i] != "--":
        opt = out[i]
        if opt == "--tmpfs":
            out[i:i] = ["--size", str(size_bytes)]
            i += 4  # --size N --tmpfs PATH
            continue
        if opt == "--dev" and i + 1 < len(out):
            # bwrap's /dev is an unsized tmpfs whose shm/ is writable: a sized tmpfs over shm/
            shm = out[i + 1].rstrip("/") + "/shm"
            out[i + 2 : i + 2] = ["--size", str(size_bytes), "--tmpfs", shm]
            i += 6
            continue
        i += 1 + _BWRAP_OPERANDS.get(opt, 0)
    return out


@lru_cache(maxsize=8)
def _bwrap_has_size(bwrap: str) -> bool:
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in text


# How many operands each bwrap option takes (options not listed take none).
_BWRAP_OPERANDS = {
    "--args": 1,
    "--argv0": 1,
    "--userns": 1,
    "--userns2": 1,
    "--pidns": 1,
    "--uid": 1,
    "--gid": 1,
    "--hostname": 1,
    "--chdir": 1,
    "--unsetenv": 1,
    "--setenv": 2,
    "--lock-file": 1,
    "--sync-fd": 1,
    "--bind": 2,
    "--bind-try": 2,
    "--dev-bind": 2,
    "--dev-bind-try": 2,
    "--ro-bind": 2,
    "--ro-bind-try": 2,
    "--bind-fd": 2,
    "--ro-bind-fd": 2,
    "--remount-ro": 1,
    "--overlay-src": 1,
    "--overlay": 3,
    "--tmp-overlay": 1,
    "--ro-overlay": 1,
    "--exec-label": 1,
    "--file-label": 1,
    "--proc": 1,
    "--dev": 1,
    "--tmpfs": 1,
    "--mqueue": 1,
    "--dir": 1,
    "--file": 2,
    "--bind-data": 2,
    "--ro-bind-data": 2,
    "--symlink": 2,
    "--seccomp": 1,
    "--add-seccomp-fd": 1,
    "--block-fd": 1,
    "--userns-block-fd": 1,
    "--info-fd": 1,
    "--json-status-fd": 1,
    "--cap-add": 1,
    "--cap-drop": 1,
    "--perms": 1,
    "--size": 1,
    "--chmod": 2,
}
