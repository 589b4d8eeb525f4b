"""The process's private scratch folder for the sandbox's host-side files: the seccomp filter that
bwrap loads and the per-command bwrap info files. Never reachable from inside a sandbox.

One 0700 folder per process, named `mkcode-sandbox-<pid>-XXXX` in the temp folder. It is removed
at a normal exit (atexit), by `remove()` on the front ends' hard exits (`os._exit` skips atexit),
and, for a process that was killed, by the next mkcode process that opens its own: folders of this
user whose pid is no longer running are swept then.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading

import psutil

PREFIX = "mkcode-sandbox-"

_lock = threading.Lock()
_dir: str | None = None


def path() -> str:
    """This process's folder, created (and stale ones swept) on first use or if removed."""
    global _dir
    with _lock:
        if _dir is None or not os.path.isdir(_dir):
            sweep_stale()
            _dir = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
        return _dir


def remove() -> None:
    """Remove this process's folder now (idempotent; a later `path()` makes a new one). A forked
    child that inherited its parent's folder forgets it without removing it."""
    global _dir
    with _lock:
        d, _dir = _dir, None
    if d is not None and os.path.basename(d).startswith(f"{PREFIX}{os.getpid()}-"):
        shutil.rmtree(d, ignore_errors=True)


atexit.register(remove)  # once per process; a no-op where no folder was made


def sweep_stale(base: str | None = None) -> list[str]:
    """Remove the folders left by this user's mkcode processes that are no longer running (killed,
    or ended by a signal that skipped every cleanup). Only real folders (not links) owned by this
    user and named for a pid that does not exist are touched. Returns what was removed."""
    base = base or tempfile.gettempdir()
    uid, me, removed = os.getuid(), os.getpid(), []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        pid_text = entry.name[len(PREFIX) :].split("-", 1)[0] if entry.name.startswith(PREFIX) else ""
        if not pid_text.isdigit() or int(pid_text) == me or psutil.pid_exists(int(pid_text)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed
