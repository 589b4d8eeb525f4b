"""Hostile paths against every file tool: traversal, absolute, symlinks, hard links, /proc, devices."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from mkcode.tools import ToolRegistry

# (tool, extra args) for each tool that takes a file path.
FILE_CALLS = [
    ("read_file", {}),
    ("edit_file", {"old_string": "TOP SECRET", "new_string": "PWNED"}),
    ("write_file", {"content": "PWNED\n"}),
    ("grep", {"pattern": "SECRET"}),
]


def _hostile_paths(ws: Path, outside: Path) -> dict[str, str]:
    secret = outside / "secret.txt"
    (ws / "link_file").symlink_to(secret)
    (ws / "link_dir").symlink_to(outside)
    (ws / "rel_link").symlink_to(os.path.relpath(secret, ws))
    (ws / "chain1").symlink_to("chain2")
    (ws / "chain2").symlink_to(secret)
    (ws / "sub").mkdir()
    return {
        "dotdot": f"../{outside.name}/secret.txt",
        "dotdot_nested": f"sub/../../{outside.name}/secret.txt",
        "absolute": str(secret),
        "symlink_file": "link_file",
        "symlink_dir": "link_dir/secret.txt",
        "relative_symlink": "rel_link",
        "symlink_chain": "chain1",
        "proc_self_root": f"/proc/self/root{secret}",
        "proc_self_cwd": "/proc/self/cwd/hello.txt",
        "proc_thread_self": f"/proc/thread-self/root{secret}",
        "sys": "/sys/kernel/notes",
        "etc": "/etc/passwd",
    }


@pytest.mark.parametrize("tool,extra", FILE_CALLS, ids=[c[0] for c in FILE_CALLS])
@pytest.mark.parametrize(
    "case",
    [
        "dotdot",
        "dotdot_nested",
        "absolute",
        "symlink_file",
        "symlink_dir",
        "relative_symlink",
        "symlink_chain",
        "proc_self_root",
        "proc_self_cwd",
        "proc_thread_self",
        "sys",
        "etc",
    ],
)
def test_file_tools_refuse_escapes(registry: ToolRegistry, ws_dir: Path, outside: Path, tool, extra, case):
    paths = _hostile_paths(ws_dir, outside)
    before = (outside / "secret.txt").read_bytes()
    result = registry.execute(tool, {"path": paths[case], **extra})
    assert not result.ok, result
    assert "SECRET" not in result.output
    assert result.error and ("refused" in result.error or "outside" in result.error), result.error
    assert (outside / "secret.txt").read_bytes() == before
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize(
    "path_case", ["..", "outside_abs", "link_dir", "/proc/self/root", "/proc/self/cwd", "/"]
)
def test_list_dir_refuses_escapes(registry: ToolRegistry, ws_dir: Path, outside: Path, path_case):
    (ws_dir / "link_dir").symlink_to(outside)
    path = {"outside_abs": str(outside)}.get(path_case, path_case)
    result = registry.execute("list_dir", {"path": path})
    assert not result.ok
    assert "secret.txt" not in result.output


def test_write_through_dangling_symlink_is_refused(registry: ToolRegistry, ws_dir: Path, outside: Path):
    (ws_dir / "dangling").symlink_to(outside / "planted.txt")
    result = registry.execute("write_file", {"path": "dangling", "content": "x"})
    assert not result.ok and "outside" in (result.error or "")
    assert not (outside / "planted.txt").exists()


def test_write_into_symlinked_dir_is_refused(registry: ToolRegistry, ws_dir: Path, outside: Path):
    (ws_dir / "d").symlink_to(outside)
    result = registry.execute("write_file", {"path": "d/new/deeper.txt", "content": "x"})
    assert not result.ok
    assert not (outside / "new").exists()


def test_symlink_inside_workspace_is_followed(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "alias.txt").symlink_to("hello.txt")
    result = registry.execute("read_file", {"path": "alias.txt"})
    assert result.ok and "line one" in result.output


def test_symlink_loop_is_an_error(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "loop_a").symlink_to("loop_b")
    (ws_dir / "loop_b").symlink_to("loop_a")
    result = registry.execute("read_file", {"path": "loop_a"})
    assert not result.ok and "symbolic links" in (result.error or "")


def test_hard_link_to_outside_file_is_refused_for_writes(registry: ToolRegistry, ws_dir: Path, outside: Path):
    os.link(outside / "secret.txt", ws_dir / "hard.txt")
    for tool, extra in [
        ("edit_file", {"old_string": "TOP SECRET", "new_string": "PWNED"}),
        ("write_file", {"content": "PWNED\n"}),
    ]:
        result = registry.execute(tool, {"path": "hard.txt", **extra})
        assert not result.ok and "hard link" in (result.error or ""), result
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"


def test_device_files_are_refused(registry: ToolRegistry, ws_dir: Path):
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    os.mknod(ws_dir / "null_dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    for tool, extra in [("read_file", {}), ("write_file", {"content": "x"}), ("edit_file", FILE_CALLS[1][1])]:
        result = registry.execute(tool, {"path": "null_dev", **extra})
        assert not result.ok and "character device" in (result.error or ""), result
    for path in ("/dev/zero", "/dev/null", "/dev/../dev/zero"):
        assert not registry.execute("read_file", {"path": path}).ok


def test_fifo_is_refused_without_blocking(registry: ToolRegistry, ws_dir: Path):
    os.mkfifo(ws_dir / "pipe")
    results = []
    t = threading.Thread(target=lambda: results.append(registry.execute("read_file", {"path": "pipe"})))
    t.start()
    t.join(timeout=5)
    assert not t.is_alive(), "read_file blocked on a FIFO"
    assert not results[0].ok and "FIFO" in (results[0].error or "")
    assert not registry.execute("write_file", {"path": "pipe", "content": "x"}).ok


def test_socket_file_is_refused(registry: ToolRegistry, ws_dir: Path):
    import socket

    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(ws_dir / "sock"))
        result = registry.execute("read_file", {"path": "sock"})
        assert not result.ok and "socket" in (result.error or "")
    finally:
        s.close()


def test_protected_dirs_refuse_writes(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / ".git" / "hooks").mkdir(parents=True)
    (ws_dir / ".git" / "config").write_text("[core]\n")
    for path in (
        ".git/hooks/pre-commit",
        ".git/config",
        "sub/../.git/hooks/post-checkout",
        ".mkcode/settings.json",
    ):
        result = registry.execute("write_file", {"path": path, "content": "#!/bin/sh\nevil\n"})
        assert not result.ok and "protected" in (result.error or ""), (path, result)
    assert not (ws_dir / ".git" / "hooks" / "pre-commit").exists()
    # Reading them is fine.
    assert registry.execute("read_file", {"path": ".git/config"}).ok


def test_nul_byte_and_empty_paths(registry: ToolRegistry):
    for path in ("", "hello\x00.txt"):
        result = registry.execute("read_file", {"path": path})
        assert not result.ok


def test_extra_root_is_allowed(ws_dir: Path, outside: Path):
    from mkcode.tools import PermissionMode, Workspace

    reg = ToolRegistry(Workspace(ws_dir, extra_roots=[outside]), mode=PermissionMode.FULL_AUTO)
    assert reg.execute("read_file", {"path": str(outside / "secret.txt")}).ok


def test_workspace_root_must_be_sane(tmp_path: Path):
    from mkcode.tools import Workspace

    for bad in ("/", "/proc", str(tmp_path / "missing")):
        with pytest.raises(ValueError):
            Workspace(bad)
