"""Fixtures for the host-safety suites: a sandbox runner, fake homes, hostile workspaces.

Nothing here touches the real $HOME: a fake one is made under /var/tmp (outside the sandbox's
private /tmp, so the sandbox's deny-by-default treatment of $HOME is what hides it) and passed
to the sandbox through the command's environment.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mkcode.tools.sandbox import bwrap as bwrap_module
from mkcode.tools.sandbox.runner import SandboxSettings, run_shell_command

# The interpreter's real file: a venv's python link may point into a folder the sandbox hides.
PYTHON = os.path.realpath(sys.executable)
IS_ROOT = os.geteuid() == 0


@dataclass(frozen=True)
class Ran:
    output: str
    exit_code: int | None
    notes: tuple[str, ...]


SandboxRun = Callable[..., Ran]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    (d / "hello.txt").write_text("hello\n")
    return d


@pytest.fixture
def fake_home() -> Iterator[Path]:
    """A $HOME full of secrets and start-up files, outside /tmp; removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="mkcode-fake-home-", dir="/var/tmp"))
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nSSH-SECRET-4711\n")
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA user@host\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = AWS-SECRET-4711\n")
    (home / ".config" / "mkcode").mkdir(parents=True)
    (home / ".config" / "mkcode" / "config.toml").write_text('api_key = "MKCODE-SECRET-4711"\n')
    (home / ".bashrc").write_text("# the user's bashrc\n")
    (home / ".gitconfig").write_text("[user]\n\tname = Someone\n")
    (home / "notes.txt").write_text("PRIVATE-NOTES-4711\n")
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _env_with_home(home: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if home is not None:
        env["HOME"] = str(home)
    return env


@pytest.fixture
def sandbox(sandbox_available: None) -> SandboxRun:
    """Run a shell command sandboxed: run(command, ws=..., home=None, timeout=30, settings=None)."""

    def run(
        command: str,
        ws: Path,
        home: Path | None = None,
        timeout: float = 30,
        settings: SandboxSettings | None = None,
    ) -> Ran:
        out = run_shell_command(
            command,
            roots=[str(ws)],
            cwd=str(ws),
            timeout_s=timeout,
            settings=settings or SandboxSettings(),
            sandboxed=True,
            environ=_env_with_home(home),
        )
        return Ran(out.process.output, out.process.exit_code, out.notes)

    return run


@pytest.fixture(params=["all-layers", "without-landlock"])
def layers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with every layer, then with Landlock off, so the mount plan alone is checked."""
    if request.param == "without-landlock":
        monkeypatch.setattr(bwrap_module, "host_landlock_abi", lambda: 0)
    elif bwrap_module.host_landlock_abi() < 1:
        pytest.skip("this kernel offers no Landlock (the without-landlock case covers it)")
    return request.param


def py(code: str) -> str:
    """A shell command running `code` with the host's interpreter inside the sandbox."""
    return f"{PYTHON} -I -S -c {shlex_quote(code)}"


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# A ctypes prologue for the syscall tests: `call(nr, *args)` returns (result, errno).
SYSCALL_PROLOGUE = (
    "import ctypes, os, errno\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def call(nr, *args):\n"
    "    ctypes.set_errno(0)\n"
    "    r = libc.syscall(nr, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])\n"
    "    return r, ctypes.get_errno()\n"
)
