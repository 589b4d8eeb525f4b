"""read_file, list_dir, glob, grep, edit_file, write_file: behaviour, caps and odd content."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mkcode.tools import PermissionMode, ToolRegistry, Workspace
from mkcode.tools.builtin import EditFile, Glob, Grep, ListDir, ReadFile, RunShell, WriteFile
from mkcode.tools.builtin.read_file import DEFAULT_LIMIT, MAX_LINE_CHARS
from mkcode.tools.safe_io import MAX_EDIT_BYTES

BAD_NAME = b"bad\xff\xfename.txt"  # not UTF-8


def _json_safe(result) -> None:
    """Every result must serialise to UTF-8 JSON (what `mkcode tool` prints and the model reads)."""
    json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")


# -- read_file ---------------------------------------------------------------------------------


def test_read_numbers_lines_and_pages(registry: ToolRegistry):
    r = registry.execute("read_file", {"path": "hello.txt"})
    assert r.ok and r.output.splitlines()[0] == "     1\tline one"
    r = registry.execute("read_file", {"path": "hello.txt", "offset": 2, "limit": 1})
    assert r.ok and r.output.splitlines()[0] == "     2\tline two"
    assert "offset=3" in r.output  # tells the model how to continue
    r = registry.execute("read_file", {"path": "hello.txt", "offset": 99})
    assert not r.ok and "past the end" in (r.error or "")


def test_read_many_lines_is_capped(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "many.txt").write_text("".join(f"row {i}\n" for i in range(100_000)))
    r = registry.execute("read_file", {"path": "many.txt"})
    assert r.ok and r.meta["last_line"] == DEFAULT_LIMIT and r.meta["more"]
    r = registry.execute("read_file", {"path": "many.txt", "offset": 99_999, "limit": 10})
    assert r.ok and "row 99998" in r.output and "row 99999" in r.output


def test_read_huge_sparse_file_is_binary_and_fast(registry: ToolRegistry, ws_dir: Path):
    with open(ws_dir / "huge.bin", "wb") as f:
        f.truncate(20 * 1024**3)  # 20 GiB of zeros, sparse
    r = registry.execute("read_file", {"path": "huge.bin"})
    assert not r.ok and "binary" in (r.error or "")
    r = registry.execute("grep", {"pattern": "x"})
    assert r.ok  # skipped, not read


def test_read_giant_line_is_cut(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "wide.txt").write_bytes(b"a" * (8 * 1024 * 1024) + b"\nsecond\n")
    r = registry.execute("read_file", {"path": "wide.txt"})
    assert r.ok and len(r.output) < 3 * MAX_LINE_CHARS
    assert "line cut" in r.output and "     2\tsecond" in r.output


@pytest.mark.parametrize(
    "content", [b"\x00\x01\x02ELF", bytes(range(256)) * 4, b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64]
)
def test_read_binary_is_refused(registry: ToolRegistry, ws_dir: Path, content: bytes):
    (ws_dir / "blob").write_bytes(content)
    r = registry.execute("read_file", {"path": "blob"})
    assert not r.ok and "binary" in (r.error or "")


def test_read_non_utf8_content(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "latin1.txt").write_bytes("café\nnaïve\n".encode("latin-1"))
    r = registry.execute("read_file", {"path": "latin1.txt"})
    assert r.ok and "caf\ufffd" in r.output and "not valid UTF-8" in r.output
    _json_safe(r)


def test_read_empty_file(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "empty").write_bytes(b"")
    r = registry.execute("read_file", {"path": "empty"})
    assert r.ok and "empty" in r.output


def test_read_directory_is_an_error(registry: ToolRegistry):
    r = registry.execute("read_file", {"path": "src"})
    assert not r.ok and "directory" in (r.error or "")


# -- non-UTF-8 names -----------------------------------------------------------------------------


def test_non_utf8_file_names(registry: ToolRegistry, ws_dir: Path):
    raw = os.fsencode(ws_dir) + b"/" + BAD_NAME
    fd = os.open(raw, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"needle in a bad name\n")
    os.close(fd)
    listing = registry.execute("list_dir", {})
    assert listing.ok and "bad\\xff\\xfename.txt" in listing.output
    _json_safe(listing)
    found = registry.execute("glob", {"pattern": "bad*"})
    assert found.ok and "bad\\xff\\xfename.txt" in found.output
    hit = registry.execute("grep", {"pattern": "needle"})
    assert hit.ok and "bad\\xff\\xfename.txt:1:needle" in hit.output
    _json_safe(hit)
    # The displayed (escaped) name reaches the file; a surrogate-escaped string is not valid
    # Unicode and is refused by the argument check with a clear message.
    r = registry.execute("read_file", {"path": "bad\\xff\\xfename.txt"})
    assert r.ok and "needle" in r.output, r
    r = registry.execute("read_file", {"path": os.fsdecode(BAD_NAME)})
    assert not r.ok and "surrogate" in (r.error or ""), r
    r = registry.execute(
        "edit_file", {"path": "bad\\xff\\xfename.txt", "old_string": "needle", "new_string": "pin"}
    )
    assert r.ok, r
    _json_safe(r)
    assert Path(os.fsdecode(raw)).read_bytes() == b"pin in a bad name\n"


# -- list_dir / glob / grep ---------------------------------------------------------------------


def test_list_dir_kinds(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "ln").symlink_to("hello.txt")
    os.mkfifo(ws_dir / "fifo")
    r = registry.execute("list_dir", {"path": "."})
    assert r.ok
    lines = r.output.splitlines()
    assert "src/" in lines and "ln -> hello.txt" in lines and "fifo [fifo]" in lines
    assert any(line.startswith("hello.txt  (") for line in lines)


def test_glob_patterns(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "src" / "pkg").mkdir()
    (ws_dir / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (ws_dir / ".git").mkdir()
    (ws_dir / ".git" / "hidden.py").write_text("")
    assert registry.execute("glob", {"pattern": "**/*.py"}).output.splitlines() == [
        "src/app.py",
        "src/pkg/mod.py",
    ]
    assert registry.execute("glob", {"pattern": "*.py"}).output == "no files match *.py"
    assert registry.execute("glob", {"pattern": "src/*.py"}).output == "src/app.py"
    assert registry.execute("glob", {"pattern": "src/**/m?d.py"}).output == "src/pkg/mod.py"
    for bad in ("../*", "/etc/*", "src/../../*"):
        assert not registry.execute("glob", {"pattern": bad}).ok


def test_glob_does_not_follow_symlinked_dirs_out(registry: ToolRegistry, ws_dir: Path, outside: Path):
    (ws_dir / "out").symlink_to(outside)
    r = registry.execute("glob", {"pattern": "**/*.txt"})
    assert "secret" not in r.output
    assert not registry.execute("glob", {"pattern": "out/*.txt"}).ok


@pytest.mark.parametrize("use_rg", [False, True], ids=["python", "ripgrep"])
def test_grep(workspace: Workspace, ws_dir: Path, outside: Path, use_rg: bool):
    grep = Grep(use_ripgrep=use_rg)
    if use_rg and grep.ripgrep(workspace) is None:
        pytest.skip("ripgrep (rg) is not installed; the Python fallback is tested")
    reg = ToolRegistry(workspace, mode=PermissionMode.FULL_AUTO, tools=[grep])
    (ws_dir / "out").symlink_to(outside)
    (ws_dir / "bin.dat").write_bytes(b"\x00return 42")
    r = reg.execute("grep", {"pattern": r"return \d+"})
    assert r.ok and r.output.splitlines() == ["src/app.py:2:    return 42"], r.output
    assert r.meta["engine"] == ("ripgrep" if use_rg else "python")
    assert reg.execute("grep", {"pattern": "line", "glob": "*.py"}).output.startswith("no matches")
    assert reg.execute("grep", {"pattern": "line t", "path": "hello.txt"}).output.count("\n") == 1
    assert reg.execute("grep", {"pattern": "return", "path": "src", "glob": "*.py"}).ok
    assert not reg.execute("grep", {"pattern": "SECRET", "path": "out"}).ok
    assert reg.execute("grep", {"pattern": "TOP SECRET"}).output.startswith("no matches")
    bad = reg.execute("grep", {"pattern": "("})
    assert not bad.ok and "regular expression" in (bad.error or "")


def test_grep_caps_matches(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "many.txt").write_text("hit\n" * 5000)
    r = registry.execute("grep", {"pattern": "hit"})
    assert r.ok and r.output.count("\n") <= 501 and "more matches" in r.output


# -- edit_file ----------------------------------------------------------------------------------


def test_edit_unique_match_with_diff(registry: ToolRegistry, ws_dir: Path):
    r = registry.execute(
        "edit_file", {"path": "src/app.py", "old_string": "return 42", "new_string": "return 43"}
    )
    assert r.ok
    assert "-    return 42" in r.output and "+    return 43" in r.output and "--- a/src/app.py" in r.output
    assert (ws_dir / "src" / "app.py").read_text() == "def main():\n    return 43\n"


def test_edit_requires_uniqueness_unless_replace_all(registry: ToolRegistry, ws_dir: Path):
    r = registry.execute("edit_file", {"path": "hello.txt", "old_string": "line", "new_string": "row"})
    assert not r.ok and "3 times" in (r.error or "")
    r = registry.execute(
        "edit_file", {"path": "hello.txt", "old_string": "line", "new_string": "row", "replace_all": True}
    )
    assert r.ok and r.meta["replacements"] == 3
    assert (ws_dir / "hello.txt").read_text() == "row one\nrow two\nrow three\n"


@pytest.mark.parametrize(
    "old,new,message",
    [("absent", "x", "not found"), ("", "x", "empty"), ("line one", "line one", "identical")],
)
def test_edit_errors(registry: ToolRegistry, old: str, new: str, message: str):
    r = registry.execute("edit_file", {"path": "hello.txt", "old_string": old, "new_string": new})
    assert not r.ok and message in (r.error or "")


def test_edit_missing_file_and_binary(registry: ToolRegistry, ws_dir: Path):
    r = registry.execute("edit_file", {"path": "nope.txt", "old_string": "a", "new_string": "b"})
    assert not r.ok and "write_file" in (r.error or "")
    (ws_dir / "b.bin").write_bytes(b"\x00\x01abc")
    r = registry.execute("edit_file", {"path": "b.bin", "old_string": "abc", "new_string": "x"})
    assert not r.ok and "binary" in (r.error or "")


def test_edit_crlf_file(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "dos.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    r = registry.execute("edit_file", {"path": "dos.txt", "old_string": "one\ntwo", "new_string": "1\n2"})
    assert r.ok
    assert (ws_dir / "dos.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


def test_edit_keeps_non_utf8_bytes_and_mode(registry: ToolRegistry, ws_dir: Path):
    p = ws_dir / "script.sh"
    p.write_bytes(b"#!/bin/sh\necho caf\xe9\necho old\n")
    p.chmod(0o751)
    r = registry.execute(
        "edit_file", {"path": "script.sh", "old_string": "echo old", "new_string": "echo new"}
    )
    assert r.ok
    _json_safe(r)
    assert p.read_bytes() == b"#!/bin/sh\necho caf\xe9\necho new\n"
    assert stat.S_IMODE(p.stat().st_mode) == 0o751
    assert [x.name for x in ws_dir.iterdir() if ".mkcode-" in x.name] == []  # no temp files left


def test_edit_too_large_file(registry: ToolRegistry, ws_dir: Path):
    (ws_dir / "big.txt").write_bytes(b"x\n" * (MAX_EDIT_BYTES // 2 + 10))
    r = registry.execute(
        "edit_file", {"path": "big.txt", "old_string": "x", "new_string": "y", "replace_all": True}
    )
    assert not r.ok and "limit" in (r.error or "")


def test_edit_detects_change_between_preview_and_write(workspace: Workspace, ws_dir: Path):
    from mkcode.tools import Decision

    def approver(request):
        (ws_dir / "hello.txt").write_text("changed behind our back\nline one\n")
        return Decision.ALLOW_ONCE

    reg = ToolRegistry(workspace, mode=PermissionMode.ASK, approver=approver)
    r = reg.execute("edit_file", {"path": "hello.txt", "old_string": "line one", "new_string": "x"})
    assert not r.ok and "changed since" in (r.error or "")


# -- write_file ---------------------------------------------------------------------------------


def test_write_new_file_with_parents(registry: ToolRegistry, ws_dir: Path):
    r = registry.execute("write_file", {"path": "a/b/c.txt", "content": "hi\n"})
    assert r.ok and r.meta["created"] and "+++ b/a/b/c.txt" in r.output and "--- /dev/null" in r.output
    assert (ws_dir / "a" / "b" / "c.txt").read_text() == "hi\n"


def test_write_overwrites_atomically_keeping_mode(registry: ToolRegistry, ws_dir: Path):
    p = ws_dir / "hello.txt"
    p.chmod(0o600)
    inode = p.stat().st_ino
    r = registry.execute("write_file", {"path": "hello.txt", "content": "line one\nchanged\n"})
    assert r.ok and "-line two" in r.output and "+changed" in r.output
    assert p.read_text() == "line one\nchanged\n"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert p.stat().st_ino != inode  # replaced by rename, not rewritten in place


def test_write_limits(registry: ToolRegistry):
    r = registry.execute("write_file", {"path": "big.txt", "content": "x" * (MAX_EDIT_BYTES + 1)})
    assert not r.ok and "limit" in (r.error or "")
    r = registry.execute("write_file", {"path": "src", "content": "x"})
    assert not r.ok and "directory" in (r.error or "")
    r = registry.execute("write_file", {"path": "hello.txt/x", "content": "x"})
    assert not r.ok


def test_write_lone_surrogates(registry: ToolRegistry, ws_dir: Path):
    for i, content in enumerate(("raw \udcff byte", "bad \ud800 surrogate")):
        r = registry.execute("write_file", {"path": f"s{i}.txt", "content": content})
        assert not r.ok and "surrogate" in (r.error or "")
        assert not (ws_dir / f"s{i}.txt").exists()


def test_every_tool_has_a_schema_and_description():
    for tool in (ReadFile(), ListDir(), Glob(), Grep(), EditFile(), WriteFile(), RunShell()):
        spec = tool.spec().to_openai()
        fn = spec["function"]
        assert fn["name"] and len(fn["description"]) > 40
        assert fn["parameters"]["type"] == "object" and fn["parameters"]["additionalProperties"] is False
