"""Fixtures for the tools tests: a workspace, a directory outside it, registries, the sandbox."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from mkcode.tools import AuditLog, PermissionMode, SandboxSettings, ToolRegistry, Workspace


@pytest.fixture
def ws_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    (d / "hello.txt").write_text("line one\nline two\nline three\n")
    (d / "src").mkdir()
    (d / "src" / "app.py").write_text("def main():\n    return 42\n")
    return d


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the workspace holding a 'secret' the tools must never touch."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("TOP SECRET\n")
    return d


@pytest.fixture
def workspace(ws_dir: Path) -> Workspace:
    return Workspace(ws_dir)


MakeRegistry = Callable[..., ToolRegistry]


@pytest.fixture
def make_registry(workspace: Workspace) -> MakeRegistry:
    def make(mode: str = "full-auto", **kw) -> ToolRegistry:
        kw.setdefault("audit", AuditLog())
        return ToolRegistry(workspace, mode=PermissionMode(mode), **kw)

    return make


@pytest.fixture
def registry(make_registry: MakeRegistry) -> ToolRegistry:
    return make_registry("full-auto")


@pytest.fixture
def shell(registry: ToolRegistry, sandbox_available: None) -> Callable[..., object]:
    """Run a command through the registry (full-auto, sandboxed)."""

    def run(command: str, timeout: float = 20, reg: ToolRegistry | None = None):
        return (reg or registry).execute("run_shell", {"command": command, "timeout": timeout})

    return run


def no_sandbox_settings() -> SandboxSettings:
    return SandboxSettings(dangerously_no_sandbox=True)


def processes_matching(marker: str) -> list[int]:
    """PIDs on the host whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found
