"""`mkcode tool`: one JSON object out, exit codes 0 (ok), 1 (tool error), 3 (denied)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mkcode.app.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["tool", *argv])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # exactly one JSON object
    return rc, json.loads(lines[0])


def test_read_ok(capsys, ws_dir: Path):
    rc, obj = run_cli(capsys, "read_file", "--workspace", str(ws_dir), "--args", '{"path": "hello.txt"}')
    assert rc == 0 and obj["ok"] is True and "1\tline one" in obj["output"]


def test_tool_error_exit_1(capsys, ws_dir: Path):
    rc, obj = run_cli(
        capsys, "read_file", "--workspace", str(ws_dir), "--args", '{"path": "../../etc/passwd"}'
    )
    assert rc == 1 and obj["ok"] is False and "outside the workspace" in obj["error"]
    rc, obj = run_cli(capsys, "nope", "--workspace", str(ws_dir))
    assert rc == 1 and "unknown tool" in obj["error"]
    rc, obj = run_cli(capsys, "read_file", "--workspace", str(ws_dir), "--args", "{bad json")
    assert rc == 1 and "not valid JSON" in obj["error"]
    rc, obj = run_cli(capsys, "read_file", "--workspace", str(ws_dir / "missing"))
    assert rc == 1 and "not a directory" in obj["error"]


def test_denied_exit_3_and_modes(capsys, ws_dir: Path):
    args = json.dumps({"path": "hello.txt", "old_string": "line one", "new_string": "edited"})
    rc, obj = run_cli(capsys, "edit_file", "--workspace", str(ws_dir), "--args", args)
    assert rc == 3 and obj["denied"] is True and "mode ask" in obj["error"]
    rc, obj = run_cli(capsys, "edit_file", "--workspace", str(ws_dir), "--args", args, "--mode", "auto-edit")
    assert rc == 0 and "+edited" in obj["output"]
    rc, obj = run_cli(
        capsys, "run_shell", "--workspace", str(ws_dir), "--args", '{"command": "ls"}', "--mode", "auto-edit"
    )
    assert rc == 3


def test_shell_full_auto_and_audit_log(capsys, ws_dir: Path, tmp_path: Path, sandbox_available):
    log = tmp_path / "audit.jsonl"
    argv = ["run_shell", "-w", str(ws_dir), "--mode", "full-auto", "--audit-log", str(log)]
    rc, obj = run_cli(capsys, *argv, "--args", '{"command": "cat hello.txt | head -1"}')
    assert rc == 0 and obj["output"].startswith("line one") and obj["meta"]["sandboxed"] is True
    rc, obj = run_cli(capsys, *argv, "--args", '{"command": "exit 4"}')
    assert rc == 1 and obj["error"] == "exit code 4"
    assert [json.loads(line)["decision"] for line in log.read_text().splitlines()] == ["allowed", "allowed"]


def test_list_and_probe(capsys, ws_dir: Path, sandbox_available):
    rc, obj = run_cli(capsys, "--list", "-w", str(ws_dir))
    assert rc == 0 and {t["name"] for t in obj["tools"]} >= {"read_file", "run_shell"}
    rc, obj = run_cli(capsys, "--probe-sandbox", "-w", str(ws_dir))
    assert rc == 0 and obj["ok"] is True and obj["bwrap"]


@pytest.mark.slow
def test_real_process_exit_codes(ws_dir: Path):
    """The installed entry point, as a subprocess (also checks nothing else is printed)."""
    base = [sys.executable, "-m", "mkcode.app.cli", "tool", "--workspace", str(ws_dir)]
    ok = subprocess.run([*base, "list_dir"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    denied = subprocess.run(
        [*base, "write_file", "--args", '{"path": "x", "content": "y"}'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert denied.returncode == 3 and json.loads(denied.stdout)["denied"] is True
    assert not (ws_dir / "x").exists()
