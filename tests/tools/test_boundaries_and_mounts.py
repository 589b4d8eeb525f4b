"""Package boundaries of mkcode.tools, and the sandbox's mount plan (no bwrap needed)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from mkcode.tools.sandbox.bwrap import mount_plan
from mkcode.tools.sandbox.env import scrub_environment

TOOLS_DIR = Path(__file__).resolve().parents[2] / "tools"
FORBIDDEN = ("torch", "textual", "mkcode.app", "mkcode.backend")


def test_tools_imports_no_torch_textual_app_or_backend():
    offenders = []
    for path in TOOLS_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}" for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)
            ]
    assert offenders == []


def test_importing_every_tools_module_stays_light():
    code = (
        "import pkgutil, sys, importlib, mkcode.tools as t\n"
        "for m in pkgutil.walk_packages(t.__path__, 'mkcode.tools.'): importlib.import_module(m.name)\n"
        "heavy = [m for m in ('torch', 'textual', 'mkcode.app', 'mkcode.backend') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_mount_plan_order_and_protections(tmp_path: Path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / "vendor" / "lib").mkdir(parents=True)
    (ws / "vendor" / "lib" / ".git").mkdir()  # nested repo without hooks/: created, then protected
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text("gitdir: ../.git\n")  # a worktree-style pointer file
    (ws / ".mkcode").mkdir()
    plan = mount_plan([str(ws)])
    args = plan.args
    assert args[:3] == ["--ro-bind", "/", "/"]
    assert args.index("--tmpfs") < args.index("--bind")  # private /tmp first, then the workspace
    assert str(home / ".ssh") in _pairs(args, "--tmpfs")
    assert ["--ro-bind", "/dev/null", str(home / ".netrc")] == args[
        args.index("/dev/null") - 1 : args.index("/dev/null") + 2
    ]
    ro = _pairs(args, "--ro-bind")
    for p in (".git/hooks", ".git/config", "vendor/lib/.git/hooks", "wt/.git", ".mkcode"):
        assert str(ws / p) in ro, p
    assert (ws / "vendor" / "lib" / ".git" / "hooks").is_dir()
    # Later mounts win in bwrap: every protection comes after the workspace's read-write bind.
    ws_bind = args.index(str(ws))
    assert all(args.index(str(ws / p)) > ws_bind for p in (".git/hooks", ".mkcode"))


def test_symlinked_hooks_make_git_dir_read_only(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / "myhooks").mkdir()
    (ws / ".git" / "hooks").symlink_to("../myhooks")
    plan = mount_plan([str(ws)])
    assert str(ws / ".git") in _pairs(plan.args, "--ro-bind") and plan.notes


def test_scrub_environment_keeps_ordinary_variables():
    env = {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x", "NPM_TOKEN": "y"}
    clean, removed = scrub_environment(env)
    assert clean == {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    assert removed == ["AWS_SECRET_ACCESS_KEY", "NPM_TOKEN"]
