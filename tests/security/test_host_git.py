"""Issue item 2: mkcode's own git calls never run the workspace's git config on the host.

Each planted repository names a program that a host `git status` runs (fsmonitor, clean/process
filters, config pulled in by include/includeIf, a `.git` file or `commondir` pointing at other
config, a submodule's config). The program appends to a marker file in a host directory outside
the workspace. Each test builds the system prompt (what mkcode does every turn) and asserts the
marker was not written, then runs a plain host `git status` on the same repository as a control
and asserts the marker *was* written: the plant is live, so the first assertion is meaningful.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from mkcode.app.agent.prompt import build_system_prompt
from mkcode.tools import hostgit
from mkcode.tools.sandbox.probe import SandboxStatus, probe_sandbox

GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="git is not installed")
_ID = ["-c", "user.email=t@example.invalid", "-c", "user.name=t", "-c", "commit.gpgsign=false"]


@pytest.fixture(scope="module")
def sandbox() -> None:
    status = probe_sandbox(None, (), refresh=True)
    if not status.available:
        pytest.skip(f"the kernel does not allow the sandbox here: {status.reason}")


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *_ID, *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False, env=env
    )


def host_state(d: Path) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_mode, st.st_size, p.read_bytes() if p.is_file() else b"")
    return out


class Plant:
    """A workspace repository and a marker path in a host directory outside it."""

    def __init__(self, tmp: Path):
        self.ws = tmp / "ws"
        self.host = tmp / "host"
        self.host.mkdir()
        (self.host / "keep.txt").write_text("host file\n")
        self.marker = self.host / "marker"
        self.ws.mkdir()

    def repo(self, d: Path | None = None) -> Path:
        d = d or self.ws
        d.mkdir(parents=True, exist_ok=True)
        assert git(d, "init", "-q", "-b", "main", ".").returncode == 0
        (d / "a.txt").write_text("hello\n")
        git(d, "add", "a.txt")
        assert git(d, "commit", "-qm", "init").returncode == 0
        return d

    def script(self, name: str, body: str = "") -> str:
        p = self.ws / name
        p.write_text(f"#!/bin/sh\necho {name} >> {self.marker}\n{body}")
        p.chmod(0o755)
        return str(p)

    def prompt(self) -> str:
        return build_system_prompt(self.ws, roots=[str(self.ws)], include_agents_md=False)

    def check(self, control: Callable[[], object] | None = None) -> str:
        before = host_state(self.host)
        text = self.prompt()
        assert not self.marker.exists(), f"repository config ran on the host: {self.marker.read_text()}"
        assert host_state(self.host) == before
        # Control: the same repository does run the program under a plain host `git status`.
        (control or (lambda: git(self.ws, "status", "--short")))()
        assert self.marker.exists(), "control: the plant did not fire under host git"
        return text


@pytest.fixture
def plant(tmp_path: Path) -> Plant:
    return Plant(tmp_path)


def test_fsmonitor_in_repo_config(plant: Plant, sandbox: None):
    plant.repo()
    git(plant.ws, "config", "core.fsmonitor", plant.script("fsmonitor.sh"))
    text = plant.check()
    assert "Git status:\n## main" in text  # the status itself is still shown


def test_clean_filter_with_gitattributes(plant: Plant, sandbox: None):
    plant.repo()
    (plant.ws / ".gitattributes").write_text("* filter=evil\n")
    git(plant.ws, "config", "filter.evil.clean", plant.script("clean.sh", "cat\n"))
    os.utime(plant.ws / "a.txt", (1_000_000_000, 1_000_000_000))  # stat-dirty: status re-hashes it
    plant.check()


def test_process_filter(plant: Plant, sandbox: None):
    plant.repo()
    (plant.ws / ".gitattributes").write_text("*.txt filter=evil\n")
    git(plant.ws, "config", "filter.evil.process", plant.script("process.sh", "exit 1\n"))
    os.utime(plant.ws / "a.txt", (1_000_000_000, 1_000_000_000))
    plant.check()


def test_include_path_pulls_in_fsmonitor(plant: Plant, sandbox: None):
    plant.repo()
    cfg = plant.ws / "extra.cfg"
    cfg.write_text(f"[core]\n\tfsmonitor = {plant.script('include.sh')}\n")
    git(plant.ws, "config", "include.path", str(cfg))
    plant.check()


def test_include_if_gitdir_pulls_in_fsmonitor(plant: Plant, sandbox: None):
    plant.repo()
    cfg = plant.ws / "cond.cfg"
    cfg.write_text(f"[core]\n\tfsmonitor = {plant.script('includeif.sh')}\n")
    git(plant.ws, "config", "includeIf.gitdir:/.path", str(cfg))
    plant.check()


def test_git_file_redirects_to_planted_gitdir(plant: Plant, sandbox: None):
    plant.repo()
    (plant.ws / ".git").rename(plant.ws / ".hidden")
    (plant.ws / ".git").write_text("gitdir: .hidden\n")
    git(plant.ws, "config", "core.fsmonitor", plant.script("gitfile.sh"))
    plant.check()


def test_commondir_redirects_config(plant: Plant, sandbox: None):
    plant.repo()
    (plant.ws / ".git").rename(plant.ws / "common")
    wt = plant.ws / "wt"
    wt.mkdir()
    (wt / "HEAD").write_text("ref: refs/heads/main\n")
    (wt / "commondir").write_text("../common\n")
    shutil.copy(plant.ws / "common" / "index", wt / "index")
    (plant.ws / ".git").write_text("gitdir: wt\n")
    git(plant.ws, "--git-dir=common", "config", "core.fsmonitor", plant.script("commondir.sh"))
    plant.check()


def test_nested_repo_as_submodule(plant: Plant, sandbox: None):
    plant.repo()
    sub = plant.repo(plant.ws / "vendor" / "deep" / "sub")
    assert git(plant.ws, "add", "vendor/deep/sub").returncode == 0
    git(plant.ws, "commit", "-qm", "add nested repo")
    git(sub, "config", "core.fsmonitor", plant.script("nested.sh"))
    (sub / "a.txt").write_text("changed\n")
    plant.check()


def test_workspace_without_git_then_git_init_planted(plant: Plant, sandbox: None):
    (plant.ws / "main.py").write_text("print(1)\n")
    assert "Git repository: no" in plant.prompt()
    # What a sandboxed `git init && git config core.fsmonitor ...` leaves behind.
    plant.repo()
    git(plant.ws, "config", "core.fsmonitor", plant.script("init.sh"))
    plant.check()


def test_host_git_environment_is_not_passed(plant: Plant, sandbox: None, monkeypatch: pytest.MonkeyPatch):
    plant.repo()
    evil = plant.script("envcfg.sh")
    for k, v in {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.fsmonitor",
        "GIT_CONFIG_VALUE_0": evil,
    }.items():
        monkeypatch.setenv(k, v)
    plant.check(control=lambda: git(plant.ws, "status", "--short", env=dict(os.environ)))


def test_normal_repo_shows_branch_and_changes(plant: Plant, sandbox: None):
    plant.repo()
    git(plant.ws, "checkout", "-q", "-b", "feature/x")
    (plant.ws / "a.txt").write_text("changed\n")
    (plant.ws / "new.txt").write_text("new\n")
    text = plant.prompt()
    assert "## feature/x" in text
    assert " M a.txt" in text and "?? new.txt" in text


def _no_sandbox(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    started: list[object] = []

    def refuse(*a: object, **k: object) -> None:
        started.append(a)
        raise AssertionError("a process was started without the sandbox")

    monkeypatch.setattr(hostgit, "sandbox_status", lambda *a: SandboxStatus(False, None, "test", "test"))
    monkeypatch.setattr(hostgit, "run_shell_command", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    return started


def test_without_sandbox_no_git_runs_branch_from_head(plant: Plant, monkeypatch: pytest.MonkeyPatch):
    plant.repo()
    git(plant.ws, "config", "core.fsmonitor", plant.script("nosandbox.sh"))
    (plant.ws / ".gitattributes").write_text("* filter=evil\n")
    git(plant.ws, "config", "filter.evil.clean", plant.script("nosandbox-clean.sh", "cat\n"))
    with monkeypatch.context() as m:
        started = _no_sandbox(m)
        text = plant.prompt()
    assert started == []
    assert not plant.marker.exists()
    assert "Git branch: main (status not shown: the sandbox is unavailable" in text
    git(plant.ws, "status", "--short")
    assert plant.marker.exists()  # control


def test_without_sandbox_head_fifo_does_not_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    os.mkfifo(ws / ".git" / "HEAD")
    assert stat.S_ISFIFO((ws / ".git" / "HEAD").lstat().st_mode)
    _no_sandbox(monkeypatch)
    info = hostgit.workspace_git_info(str(ws))
    assert info is not None and info.branch == "unknown (HEAD unreadable)"


def test_without_sandbox_detached_and_gitfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ws = tmp_path / "ws"
    real = tmp_path / "ws" / "store"
    real.mkdir(parents=True)
    (real / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
    (ws / ".git").write_text("gitdir: store\n")
    _no_sandbox(monkeypatch)
    info = hostgit.workspace_git_info(str(ws))
    assert info is not None and info.branch == "detached at 0123456789ab"
