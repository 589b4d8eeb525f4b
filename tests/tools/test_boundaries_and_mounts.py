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
    (home / ".bashrc").write_text("# rc\n")
    monkeypatch.setenv("HOME", str(home))
    ws = home  # the worst case: the workspace is $HOME
    (ws / ".git" / "hooks").mkdir(parents=True)
    deep = ws / "a" / "b" / "c" / "d" / "e"
    (deep / ".git").mkdir(parents=True)  # a nested repo five levels down
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text("gitdir: ../.git\n")  # a worktree-style pointer file
    (ws / ".mkcode").mkdir()
    plan = mount_plan([str(ws)])
    args = plan.args
    assert args[:3] == ["--ro-bind", "/", "/"]
    assert args.index("--tmpfs") < args.index("--bind")  # private /tmp first, then the workspace
    assert str(home / ".ssh") in _pairs(args, "--tmpfs")
    netrc = args.index(str(home / ".netrc"))
    assert args[netrc - 2 : netrc + 1] == ["--ro-bind", "/dev/null", str(home / ".netrc")]
    ro = _pairs(args, "--ro-bind")
    for p in (".git", "a/b/c/d/e/.git", "wt/.git", ".mkcode", ".bashrc"):
        assert str(ws / p) in ro, p
    # Later mounts win in bwrap: every protection comes after the workspace's read-write bind.
    ws_bind = args.index("--bind") + 1
    assert args[ws_bind] == str(ws)
    assert all(args.index(str(ws / p)) > ws_bind for p in (".git", ".mkcode", ".ssh", ".bashrc"))
    # Absent protected paths inside the workspace are guarded (a mount would create them on the host).
    assert (str(home / ".profile"), None) in plan.guarded
    assert str(ws) in plan.writable


def test_home_is_hidden_except_toolchains(tmp_path: Path, monkeypatch):
    home = tmp_path / "h"
    (home / ".cargo" / "bin").mkdir(parents=True)
    (home / ".cargo" / "credentials.toml").write_text("token = 'x'\n")
    (home / "Documents").mkdir()
    monkeypatch.setenv("HOME", str(home))
    ws = tmp_path / "ws"
    ws.mkdir()
    plan = mount_plan([str(ws)], home_allow_ro=["Documents"])
    ro = _pairs(plan.args, "--ro-bind")
    assert str(home / ".cargo") in ro and str(home / "Documents") in ro
    cred = str(home / ".cargo" / "credentials.toml")
    at = plan.args.index(cred)
    assert plan.args[at - 2 : at + 1] == ["--ro-bind", "/dev/null", cred]  # a secret inside a toolchain
    hidden = plan.args.index("/tmp")  # the home lies under the private /tmp here
    assert plan.args[hidden - 1] == "--tmpfs" and hidden < plan.args.index(str(home / ".cargo"))
    assert str(home) not in ro  # the rest of home stays hidden


def test_worktree_gitdir_and_commondir_are_read_only(tmp_path: Path):
    ws = tmp_path / "ws"
    main_git = ws / "repo" / ".git"
    wt_gitdir = main_git / "worktrees" / "wt"
    wt_gitdir.mkdir(parents=True)
    (wt_gitdir / "commondir").write_text("../..\n")
    elsewhere = ws / "elsewhere-common"
    elsewhere.mkdir()
    planted = ws / "planted"
    planted.mkdir()
    (planted / "commondir").write_text("../elsewhere-common\n")
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text(f"gitdir: {wt_gitdir}\n")
    (ws / "wt2").mkdir()
    (ws / "wt2" / ".git").write_text("gitdir: ../planted\n")  # a gitdir with a commondir redirect
    ro = _pairs(mount_plan([str(ws)]).args, "--ro-bind")
    for p in ("repo/.git", "wt/.git", "wt2/.git", "planted", "elsewhere-common"):
        assert str(ws / p) in ro, p


def test_scrub_environment_keeps_ordinary_variables():
    env = {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x", "NPM_TOKEN": "y"}
    clean, removed = scrub_environment(env)
    assert clean == {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    assert removed == ["AWS_SECRET_ACCESS_KEY", "NPM_TOKEN"]


def test_bwrap_planted_in_the_workspace_is_not_preferred(tmp_path: Path, monkeypatch):
    from mkcode.tools.sandbox import locate

    ws = tmp_path / "ws"
    planted = ws / "bin" / "bwrap"
    planted.parent.mkdir(parents=True)
    planted.write_text('#!/bin/sh\nexec "$@"\n')  # would run the command unsandboxed
    planted.chmod(0o755)
    real = tmp_path / "sys" / "bwrap"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    monkeypatch.setattr(locate, "_candidates", lambda explicit: [str(planted), str(real)])
    assert locate.find_bwrap(None, [str(ws)])[0] == str(real)
    monkeypatch.setattr(locate, "installation_paths", lambda: (str(ws / "bin"),))
    assert locate.find_bwrap(None, [str(ws)]) == (str(planted), [])  # read-only in the sandbox


def test_probe_names_the_layers_and_a_missing_landlock():
    from mkcode.tools.sandbox.probe import SandboxStatus, describe_layers

    without = describe_layers(0)
    assert any(line.startswith("landlock: not offered by this kernel") for line in without)
    assert any(line.startswith("seccomp: filter for") for line in without)
    assert "scoped" in describe_layers(6)[-1] and "scoped" not in describe_layers(5)[-1]
    text = SandboxStatus(True, "/usr/bin/bwrap", layers=without).explain()
    assert "landlock: not offered" in text and "namespaces: user (uid" in text
