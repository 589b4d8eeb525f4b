"""Issue item 5: the file tools are free of check-then-use races.

Each test swaps a workspace directory (or file) for a symlink to a fake $HOME at the exact moment
between the tool's check and its use: right after Workspace.resolve() returns (a wrapper around
it, independent of how the tool then opens the path), or through fdwalk.race_hook inside a walk
(between listing a directory and entering or opening an entry). The tool must then refuse or skip,
nothing outside the workspace may be read, listed or created, and the fake home is unchanged.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mkcode.tools import AuditLog, PermissionMode, ToolRegistry, Workspace, fdwalk
from mkcode.tools.builtin.grep import Grep
from mkcode.tools.protected import _protected_cached
from mkcode.tools.spec import ToolContext
from mkcode.tools.workspace import Access

SECRET = "TOP SECRET"


def snapshot(d: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p): (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        for p in sorted(d.rglob("*"))
    }


class Scene:
    def __init__(self, tmp: Path):
        self.home = tmp / "home"
        self.home.mkdir()
        (self.home / "data.txt").write_text(f"{SECRET} data\n")
        (self.home / "notes.txt").write_text(f"{SECRET} notes\n")
        (self.home / "homeonly.md").write_text(f"{SECRET}\n")
        self.ws = tmp / "ws"
        (self.ws / "sub").mkdir(parents=True)
        (self.ws / "sub" / "data.txt").write_text("workspace data\n")
        (self.ws / "sub" / "inner").mkdir()
        (self.ws / "sub" / "inner" / "x.txt").write_text("inner\n")
        (self.ws / "top.txt").write_text("top\n")
        self.before = snapshot(self.home)
        self.registry = ToolRegistry(Workspace(self.ws), mode=PermissionMode("full-auto"), audit=AuditLog())

    def swap_dir(self, rel: str = "sub") -> None:
        """Replace ws/rel by a symlink to the fake home (what a concurrent process could do)."""
        p = self.ws / rel
        p.rename(self.ws / f"{rel}.moved")
        p.symlink_to(self.home)

    def swap_file(self, rel: str, target: Path) -> None:
        p = self.ws / rel
        p.rename(self.ws / f"{rel}.moved")
        p.symlink_to(target)

    def home_unchanged(self) -> None:
        assert snapshot(self.home) == self.before

    def run(self, tool: str, args: dict) -> object:
        return self.registry.execute(tool, args)


@pytest.fixture
def scene(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scene:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    _protected_cached.cache_clear()
    return Scene(tmp_path)


def after_resolve(
    monkeypatch: pytest.MonkeyPatch, action: Callable[[], None], when: Callable[[int, Access], bool]
) -> None:
    """Run `action` right after the resolve() call for which when(call_number, access) holds."""
    real = Workspace.resolve
    calls = {"n": 0}

    def wrapped(self: Workspace, path: str, access: Access = Access.READ):
        rp = real(self, path, access)
        calls["n"] += 1
        if when(calls["n"], access):
            action()
        return rp

    monkeypatch.setattr(Workspace, "resolve", wrapped)


def on_event(
    monkeypatch: pytest.MonkeyPatch, event: str, path_end: str, action: Callable[[], None]
) -> list[str]:
    seen: list[str] = []

    def hook(ev: str, path: str) -> None:
        if ev == event and path.endswith(path_end) and not seen:
            seen.append(path)
            action()

    monkeypatch.setattr(fdwalk, "race_hook", hook)
    return seen


def assert_no_secret(result: object) -> None:
    text = result.output + (result.error or "")  # type: ignore[attr-defined]
    assert SECRET not in text
    assert "homeonly" not in text and "notes.txt" not in text


def test_read_file_parent_swapped_after_check(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    after_resolve(monkeypatch, scene.swap_dir, lambda n, a: n == 1)
    r = scene.run("read_file", {"path": "sub/data.txt"})
    assert not r.ok and "changed while it was being opened" in r.error
    assert_no_secret(r)
    scene.home_unchanged()


def test_read_file_itself_swapped_after_check(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    after_resolve(
        monkeypatch, lambda: scene.swap_file("top.txt", scene.home / "data.txt"), lambda n, a: n == 1
    )
    r = scene.run("read_file", {"path": "top.txt"})
    assert not r.ok
    assert_no_secret(r)
    scene.home_unchanged()


def test_list_dir_swapped_after_check(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    after_resolve(monkeypatch, scene.swap_dir, lambda n, a: n == 1)
    r = scene.run("list_dir", {"path": "sub"})
    assert not r.ok
    assert_no_secret(r)
    scene.home_unchanged()


def test_write_file_parent_swapped_after_check(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    after_resolve(monkeypatch, scene.swap_dir, lambda n, a: a is Access.WRITE and n == 2)
    r = scene.run("write_file", {"path": "sub/new/deep/planted.txt", "content": "PWNED\n"})
    assert not r.ok
    assert not (scene.home / "new").exists()
    scene.home_unchanged()


def test_write_file_created_directory_swapped(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    """mkdir(a) then, before a is entered, a becomes a symlink to home: b must not appear there."""

    def swap() -> None:
        (scene.ws / "a").rmdir()
        (scene.ws / "a").symlink_to(scene.home)

    seen = on_event(monkeypatch, "mkdir", "/ws/a", swap)
    r = scene.run("write_file", {"path": "a/b/c.txt", "content": "PWNED\n"})
    assert seen and not r.ok
    assert not (scene.home / "b").exists()
    scene.home_unchanged()


def test_edit_file_parent_swapped_before_write(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    # The home file has the same content, so a redirected edit would pass the unchanged check.
    (scene.home / "data.txt").write_text("workspace data\n")
    scene.before = snapshot(scene.home)
    after_resolve(monkeypatch, scene.swap_dir, lambda n, a: n == 2)  # the commit's re-check
    r = scene.run("edit_file", {"path": "sub/data.txt", "old_string": "workspace", "new_string": "PWNED"})
    assert not r.ok
    assert (scene.home / "data.txt").read_text() == "workspace data\n"
    scene.home_unchanged()


def test_glob_directory_swapped_before_entering(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    seen = on_event(monkeypatch, "walk_enter", "/ws/sub", scene.swap_dir)
    r = scene.run("glob", {"pattern": "**/*"})
    assert seen and r.ok
    assert_no_secret(r)
    assert "top.txt" in r.output
    scene.home_unchanged()


def test_glob_prefix_swapped_after_check(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    after_resolve(monkeypatch, scene.swap_dir, lambda n, a: n == 1)
    r = scene.run("glob", {"pattern": "sub/**/*.txt"})
    assert not r.ok
    assert_no_secret(r)
    scene.home_unchanged()


def _python_grep(scene: Scene, args: dict) -> object:
    return Grep(use_ripgrep=False).prepare(ToolContext(scene.registry.context.workspace), args).run()  # type: ignore[union-attr]


def test_grep_directory_swapped_before_entering(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    seen = on_event(monkeypatch, "walk_enter", "/ws/sub", scene.swap_dir)
    r = _python_grep(scene, {"pattern": "SECRET|data"})
    assert seen and r.ok
    assert_no_secret(r)
    scene.home_unchanged()


def test_grep_file_swapped_between_listing_and_open(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    seen = on_event(
        monkeypatch, "walk_open", "/ws/top.txt", lambda: scene.swap_file("top.txt", scene.home / "data.txt")
    )
    r = _python_grep(scene, {"pattern": "SECRET|top"})
    assert seen
    assert_no_secret(r)
    scene.home_unchanged()


def test_grep_search_root_swapped_after_check(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    after_resolve(monkeypatch, scene.swap_dir, lambda n, a: n == 1)
    r = _python_grep(scene, {"pattern": "SECRET", "path": "sub"})
    assert not r.ok
    assert_no_secret(r)
    scene.home_unchanged()


def test_nested_directory_swapped_deep_in_walk(scene: Scene, monkeypatch: pytest.MonkeyPatch):
    seen = on_event(monkeypatch, "walk_enter", "/ws/sub/inner", lambda: scene.swap_dir("sub/inner"))
    r = scene.run("glob", {"pattern": "**/*.md"})
    assert seen and r.ok
    assert_no_secret(r)
    scene.home_unchanged()


def test_symlink_inside_workspace_pointing_inside_is_followed_by_read(scene: Scene):
    """A link to a workspace file is read (resolution first, then a no-follow walk of its target)."""
    (scene.ws / "alias.txt").symlink_to("sub/data.txt")
    r = scene.run("read_file", {"path": "alias.txt"})
    assert r.ok and "workspace data" in r.output


def _undo_registry(scene: Scene):
    from mkcode.app.core.undo import SnapshottingRegistry, UndoStack

    reg = SnapshottingRegistry(Workspace(scene.ws), mode=PermissionMode("full-auto"), audit=AuditLog())
    stack = UndoStack()
    reg.checkpoint = stack.begin("turn", 0)
    return reg, reg.checkpoint


def test_undo_restore_after_directory_swapped(scene: Scene):
    """The turn edited sub/notes.txt; a sandboxed command then made sub a link to $HOME; /undo
    must not write the workspace file's old bytes over $HOME/notes.txt."""
    from mkcode.app.core.undo import restore_files

    (scene.ws / "sub" / "notes.txt").write_text("attacker-chosen bytes\n")
    reg, checkpoint = _undo_registry(scene)
    r = reg.execute("edit_file", {"path": "sub/notes.txt", "old_string": "attacker", "new_string": "x"})
    assert r.ok
    scene.swap_dir()
    restore_files(checkpoint)
    assert (scene.home / "notes.txt").read_text() == f"{SECRET} notes\n"
    scene.home_unchanged()


def test_undo_remove_after_directory_swapped(scene: Scene):
    """The turn created sub/data.txt's sibling; after the swap, /undo must not delete $HOME's file."""
    from mkcode.app.core.undo import restore_files

    reg, checkpoint = _undo_registry(scene)
    assert reg.execute("write_file", {"path": "sub/homeonly.md", "content": "new\n"}).ok
    scene.swap_dir()
    restore_files(checkpoint)
    assert (scene.home / "homeonly.md").exists()
    scene.home_unchanged()


def test_workspace_root_replaced_is_refused(scene: Scene, tmp_path: Path):
    ws = Workspace(scene.ws)
    scene.ws.rename(tmp_path / "ws.moved")
    scene.ws.mkdir()  # a different directory at the same path (the root itself can't be a symlink)
    (scene.ws / "top.txt").write_text(f"{SECRET}\n")
    reg = ToolRegistry(ws, mode=PermissionMode("full-auto"), audit=AuditLog())
    r = reg.execute("read_file", {"path": "top.txt"})
    assert not r.ok and "was replaced" in r.error and SECRET not in _text_of(r)


def _text_of(r) -> str:
    return r.output + (r.error or "")


def test_hostile_deep_tree_does_not_break_the_walk(scene: Scene):
    """300 nested directories (what a sandboxed command makes in a blink): glob and grep still answer,
    stop at fdwalk.MAX_DEPTH levels and say so. They run under a recursion limit just above the
    current depth, so a walk that recursed once per level would fail (the tree stays shallow
    enough for pytest's own recursive clean-up)."""
    fd = os.open(scene.ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(300):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"needle\n")
        os.close(leaf)
    finally:
        os.close(fd)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 150)
    try:
        r = scene.run("glob", {"pattern": "**/leaf.txt"})
        g = _python_grep(scene, {"pattern": "needle"})
    finally:
        sys.setrecursionlimit(old_limit)
    assert r.ok and "could not be read" in r.output, r.error
    assert g.ok, g.error
