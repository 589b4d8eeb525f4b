"""End to end in a real terminal: `mkcode` in tmux on a tiny synthetic checkpoint, through the
real engine (CPU). Start, type a prompt, see the turn run, /help, /quit, session saved on disk.

Needs tmux (`apt-get install -y tmux`); skipped with that reason when it is missing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (CI: apt-get install -y tmux)"
)


class Tmux:
    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.name)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.name, *keys)

    def wait_for(self, predicate, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}; screen:\n{self.screen()}")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from tests.backend.checkpoint.tiny import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)


def test_tui_in_tmux_on_the_real_engine(tmp_path, tiny_model):
    work = tmp_path / "project"
    work.mkdir()
    (work / "README.md").write_text("# demo project\n")
    data = tmp_path / "data"
    env = {
        "XDG_DATA_HOME": str(data),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "MKCODE_MAX_TOKENS": "8",
        "TERM": "xterm-256color",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = f"cd {shlex.quote(str(work))} && env {exports} {shlex.quote(sys.executable)} -m mkcode.app.cli --model {shlex.quote(str(tiny_model))} --device cpu"
    tmux = Tmux(f"mkcode-e2e-{uuid.uuid4().hex[:8]}")
    tmux.run(
        "new-session",
        "-d",
        "-s",
        tmux.name,
        "-x",
        "100",
        "-y",
        "30",
        "bash",
        "-c",
        cmd + "; echo EXITED=$?; sleep 30",
    )
    try:
        tmux.wait_for(lambda s: "Ask mkcode" in s and "mode ask" in s, 90, "the prompt and status bar")
        tmux.keys("say hello", "Enter")
        screen = tmux.wait_for(
            lambda s: "say hello" in s and "working" not in s and "ctx 0%" not in s, 90, "the turn"
        )
        assert tiny_model.name in screen  # the status bar names the model
        tmux.keys("/help", "Enter")
        tmux.wait_for(lambda s: "/undo" in s and "Esc or Ctrl+C interrupt" in s, 20, "/help output")
        tmux.keys("/quit", "Enter")
        final = tmux.wait_for(lambda s: "EXITED=" in s, 30, "mkcode to exit")
        assert "EXITED=0" in final and "saved" in final
    finally:
        tmux.run("kill-session", "-t", tmux.name)
    [path] = (data / "mkcode" / "sessions").glob("*.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0]["type"] == "session"
    assert any(r["type"] == "message" and r["message"]["role"] == "user" for r in records)
    assert any(r["type"] == "usage" and r["completion_tokens"] >= 1 for r in records)
