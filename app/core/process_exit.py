"""Leaving the process promptly, whatever is still running.

A front end returns its exit code once its own work is done, but threads it cannot stop may still
be alive: a model load blocked in native code, a tool call the agent abandoned, the engine thread
mid-step. The interpreter's normal exit would wait for the non-daemon ones (forever, for a stuck
load) and can crash in a daemon one still inside native code while the runtime is torn down (the
`terminate called without an active exception` / `Segmentation fault` exits). `leave(code)` gives
such threads a short grace, then ends the process with `os._exit` after flushing stdout and
stderr, so the exit code is the front end's and nothing is printed after it. With no other thread
alive it returns the code for a normal exit (atexit handlers and temp-dir cleanup run as usual);
`hard_exit` removes the sandbox's scratch folder itself, since `os._exit` skips atexit.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

GRACE_S = 0.5


def other_threads() -> list[threading.Thread]:
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and t.is_alive()]


def leave(code: int, grace_s: float = GRACE_S) -> int:
    """`code` once every other thread has ended within `grace_s`; otherwise exit now with it."""
    deadline = time.monotonic() + grace_s
    while other_threads():
        if time.monotonic() >= deadline:
            hard_exit(code)
        time.sleep(0.02)
    return code


def hard_exit(code: int) -> None:
    """End the process now with `code`: flush stdout and stderr, remove the sandbox's scratch folder
    (if this process made one), then `os._exit`."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    scratch = sys.modules.get("mkcode.tools.sandbox.scratch")  # never imported just to exit
    if scratch is not None:
        with contextlib.suppress(Exception):
            scratch.remove()
    os._exit(code)
