"""Ordinary work still works inside the sandbox: test a Python project, read git history, install
into a workspace venv from a local wheel (offline), compile and run C, trace a child."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import PYTHON, SandboxRun

VENV_PYTHON = os.path.abspath(sys.executable)  # mkcode's venv: visible, read-only, in the sandbox


def _project(ws: Path) -> None:
    (ws / "calc").mkdir()
    (ws / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "__init__.py").write_text("")
    (ws / "tests" / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
        "    def test_tmp(self):\n"
        "        import tempfile\n"
        "        with tempfile.TemporaryDirectory() as d:\n            open(d + '/x', 'w').write('x')\n"
    )


def test_unittest_project_builds_and_passes(sandbox: SandboxRun, ws: Path):
    _project(ws)
    r = sandbox(f"{PYTHON} -m compileall -q calc && {PYTHON} -m unittest -v 2>&1", ws)
    assert r.exit_code == 0 and "Ran 2 tests" in r.output and "OK" in r.output, r.output
    assert list((ws / "calc" / "__pycache__").glob("__init__*.pyc"))  # the build wrote into the workspace


def test_pytest_runs_in_the_sandbox(sandbox: SandboxRun, ws: Path):
    _project(ws)
    r = sandbox(f"{VENV_PYTHON} -m pytest -q -p no:cacheprovider tests 2>&1", ws, timeout=60)
    assert r.exit_code == 0 and "2 passed" in r.output, r.output


@pytest.fixture
def repo(ws: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    subprocess.run(["git", "add", "hello.txt"], cwd=ws, check=True)
    subprocess.run(["git", "commit", "-qm", "first commit"], cwd=ws, check=True, env=env)
    (ws / "hello.txt").write_text("hello\nchanged\n")
    return ws


def test_git_diff_log_status_work(sandbox: SandboxRun, repo: Path):
    r = sandbox("git log --oneline && git diff && git status --short && git show --stat HEAD | head -5", repo)
    assert r.exit_code == 0, r.output
    assert "first commit" in r.output and "+changed" in r.output and " M hello.txt" in r.output


def test_git_commit_is_refused_inside(sandbox: SandboxRun, repo: Path):
    """Committing writes .git, a step outside the sandbox (an explicit approval), never inside."""
    head = (repo / ".git" / "HEAD").read_text()
    refs = sorted(p.name for p in (repo / ".git" / "refs" / "heads").iterdir())
    r = sandbox("git -c user.email=a@b -c user.name=n commit -qam inside; echo rc=$?", repo)
    assert "rc=0" not in r.output and "Read-only file system" in r.output, r.output
    assert (repo / ".git" / "HEAD").read_text() == head
    assert sorted(p.name for p in (repo / ".git" / "refs" / "heads").iterdir()) == refs


def _build_wheel(dest: Path) -> Path:
    """A minimal pure-Python wheel, built here with zipfile (no build backend, no network)."""
    name, version = "mkdemo", "1.0"
    files = {
        "mkdemo/__init__.py": b"def hello():\n    return 'hello from mkdemo'\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def test_pip_installs_a_local_wheel_into_a_workspace_venv_offline(sandbox: SandboxRun, ws: Path):
    wheel = _build_wheel(ws)
    r = sandbox(
        f"{PYTHON} -m venv --without-pip venv && "
        f"{VENV_PYTHON} -m pip --python venv/bin/python install -q --no-index --no-deps --no-cache-dir "
        f"--disable-pip-version-check {wheel.name} 2>&1 && "
        "venv/bin/python -c 'import mkdemo; print(mkdemo.hello())'",
        ws,
        timeout=120,
    )
    assert r.exit_code == 0 and "hello from mkdemo" in r.output, r.output
    assert list((ws / "venv" / "lib").glob("python*/site-packages/mkdemo/__init__.py"))


def test_c_compiler_builds_and_runs(sandbox: SandboxRun, ws: Path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler installed")
    (ws / "hello.c").write_text('#include <stdio.h>\nint main(void){puts("compiled ok");return 0;}\n')
    r = sandbox(f"{cc} -O1 -o hello hello.c && ./hello", ws, timeout=60)
    assert r.exit_code == 0 and "compiled ok" in r.output, r.output


def test_strace_of_a_child_works(sandbox: SandboxRun, ws: Path):
    """PTRACE_TRACEME stays allowed: a debugger or tracer can run a program it starts."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    r = sandbox("strace -f -e trace=execve true 2>&1 | head -3", ws)
    assert "execve(" in r.output, r.output


def test_shell_plumbing_works(sandbox: SandboxRun, ws: Path):
    r = sandbox(
        "echo out > /dev/stdout; echo err > /dev/stderr; mkfifo /tmp/f && (echo via-fifo > /tmp/f &) && cat /tmp/f;"
        f"{PYTHON} -I -S -c 'import multiprocessing.shared_memory as s; m = s.SharedMemory(create=True, size=8);"
        ' print("shm ok"); m.close(); m.unlink()\'; ln -s hello.txt link && cat link',
        ws,
    )
    for s in ("out", "err", "via-fifo", "shm ok", "hello"):
        assert s in r.output, r.output


def test_git_status_works_in_a_worktree(sandbox: SandboxRun, repo: Path):
    """A worktree's `.git` is a file pointing into the main repository; both stay read-only and
    git still reads them (a known failure point of other sandboxes)."""
    subprocess.run(["git", "worktree", "add", "-q", "wt"], cwd=repo, check=True, capture_output=True)
    (repo / "wt" / "hello.txt").write_text("hello\nin worktree\n")
    r = sandbox("cd wt && git status --short && git diff --stat && git log --oneline | head -1", repo)
    assert r.exit_code == 0 and " M hello.txt" in r.output and "first commit" in r.output, r.output


def test_git_works_in_a_repository_of_another_owner(sandbox: SandboxRun, repo: Path):
    """Files of owners the user namespace does not map show as 'nobody' inside; git would call
    the repository of dubious ownership. Inside the sandbox every repository is trusted."""
    from .conftest import IS_ROOT

    if not IS_ROOT:
        pytest.skip("only root can hand the repository to another owner here")
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in [".", *dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), 65534, 65534)
    r = sandbox("git status --short && git log --oneline", repo)
    assert r.exit_code == 0 and " M hello.txt" in r.output and "first commit" in r.output, r.output
