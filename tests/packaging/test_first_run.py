"""The README's first command on a fresh clone with an empty cache reaches a usable prompt in time.

The first command is `python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . && .venv/bin/mkcode`.
Its install part is done here without downloading anything: a fresh venv in the clone, the clone
installed into it editable (`pip install -e .`, no dependencies), the dependencies borrowed from the
test environment through a .pth path line. Its start part, `.venv/bin/mkcode`, runs as written, in
tmux, in the clone's root, with a new HOME (empty cache, config and data); the clock runs from
launching it to the terminal UI's prompt with the demo model loaded (the status bar names it and its
backend). The issue's bound is 60 s after the install on the CI machine.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

from mkcode.app.core.backend import DEMO_MODEL_NAME
from tests.packaging.wheel_build import REPO

FIRST_RUN_BUDGET_S = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="tmux is not installed (CI: apt-get install -y tmux)"
    ),
    pytest.mark.skipif(
        shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs git and a git checkout"
    ),
]


def _install(clone: Path) -> None:
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Written first: the editable build below runs in this venv and needs setuptools from it.
    (Path(purelib) / "mkcode_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    run = subprocess.run(
        [*cmd, "--no-deps", "--no-build-isolation", "-e", str(clone)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
    ).stdout


def _wait(session: str, predicate, timeout: float) -> tuple[str, bool]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = _screen(session)
        if predicate(text):
            return text, True
        time.sleep(0.1)
    return _screen(session), False


def test_first_command_reaches_the_prompt_on_a_fresh_clone(tmp_path, record_property):
    clone = tmp_path / "mkcode"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    t_install = time.monotonic()
    _install(clone)
    install_s = time.monotonic() - t_install
    home = tmp_path / "home"
    home.mkdir()
    # Only what a new user's shell has: no MKCODE_* settings, no PYTHONPATH, nothing cached.
    env = {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = f"cd {shlex.quote(str(clone))} && env -i {exports} .venv/bin/mkcode; echo EXITED=$?; sleep 30"
    session = f"mkcode-first-run-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "110", "-y", "30", command], check=True)
    try:

        def ready(s: str) -> bool:
            return "Ask mkcode" in s and "mode ask" in s and DEMO_MODEL_NAME in s and "cpu" in s

        screen, ok = _wait(session, ready, FIRST_RUN_BUDGET_S)
        start_s = time.monotonic() - t0
        record_property("first_run_prompt_s", round(start_s, 2))
        print(f"first run: install (no downloads) {install_s:.1f} s, start to prompt {start_s:.1f} s")
        assert ok, f"no usable prompt within {FIRST_RUN_BUDGET_S:.0f} s; screen:\n{screen}"
        subprocess.run(["tmux", "send-keys", "-t", session, "/quit", "Enter"], check=True)
        final, exited = _wait(session, lambda s: "EXITED=" in s, 30)
        assert exited and "EXITED=0" in final, final
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
