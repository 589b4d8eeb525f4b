"""Clean ways out of `mkcode -p`: Ctrl+C (SIGINT) mid-generation through the real engine interrupts
the turn and exits 130 with no traceback and no engine-thread error; the process leaves promptly
even when a thread it cannot stop is still running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mkcode.app.core import process_exit


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from tests.backend.checkpoint.tiny import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)


def test_sigint_during_generation_exits_130_cleanly(tmp_path, tiny_model):
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "MKCODE_MAX_TOKENS": "100000",  # the random tiny model does not stop on its own
        "TMPDIR": str(tmp_path / "tmp"),
    }
    (tmp_path / "tmp").mkdir()
    cmd = [sys.executable, "-m", "mkcode.app.cli", "-p", "hi", "--model", str(tiny_model)]
    cmd += ["--device", "cpu", "--output-format", "stream-json"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the model is generating
            if json.loads(line)["type"] in ("text_delta", "reasoning_delta"):
                break
        else:
            pytest.fail(f"no generation; stderr: {proc.stderr.read() if proc.stderr else ''}")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Event loop is closed" not in err, err
    assert took < 5, f"took {took:.1f}s to exit"
    result = json.loads(rest.strip().splitlines()[-1])
    assert result["type"] == "result" and result["subtype"] == "interrupted"
    assert list((tmp_path / "tmp").iterdir()) == []  # no temp dirs left behind
    [session] = (tmp_path / "data" / "mkcode" / "sessions").glob("*.jsonl")
    assert any(json.loads(r)["type"] == "interrupted" for r in session.read_text().splitlines())


def test_leave_returns_when_no_thread_is_left():
    assert process_exit.leave(7, grace_s=0.01) == 7


def test_leave_exits_at_once_past_a_stuck_thread(tmp_path):
    code = (
        "import threading, time\n"
        "from mkcode.app.core.process_exit import leave\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()  # non-daemon: would hold exit\n"
        "print('leaving', flush=True)\n"
        "raise SystemExit(leave(130, grace_s=0.1))\n"
    )
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 130 and r.stdout == "leaving\n" and r.stderr == ""
    assert time.monotonic() - t0 < 10


def test_leave_waits_for_a_thread_that_ends_within_the_grace():
    t = threading.Thread(target=time.sleep, args=(0.05,))
    t.start()
    assert process_exit.leave(0, grace_s=5.0) == 0
    assert not t.is_alive()
