"""tools/gitignore.py (git's ignore rules for grep's Python walk) and tools/globbing.py (wcmatch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mkcode.tools import PermissionMode, ToolRegistry, Workspace
from mkcode.tools.builtin.grep import Grep
from mkcode.tools.gitignore import GitIgnore
from mkcode.tools.globbing import GlobError, compile_glob, literal_prefix


def _repo(ws_dir: Path) -> None:
    (ws_dir / ".git" / "info").mkdir(parents=True)
    (ws_dir / ".git" / "info" / "exclude").write_text("*.tmp\n")
    (ws_dir / ".gitignore").write_text("# build output\nbuild/\n*.log\n!keep.log\n/rooted.txt\n")
    for rel in ("build/out.py", "pkg/build/x.py", "a.log", "keep.log", "rooted.txt", "pkg/rooted.txt"):
        (ws_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws_dir / rel).write_text("needle\n")
    (ws_dir / "pkg" / ".gitignore").write_text("!a2.log\ngen/\n")
    for rel in ("pkg/a2.log", "pkg/b.log", "pkg/gen/g.py", "scratch.tmp", "build/keep.log"):
        (ws_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws_dir / rel).write_text("needle\n")


def test_rules_follow_git(ws_dir: Path, workspace: Workspace) -> None:
    _repo(ws_dir)
    rules = GitIgnore.for_walk(workspace, str(ws_dir / "pkg"))
    assert rules.repo == str(ws_dir)  # found above the walk's start

    def ignored(rel: str) -> bool:
        return rules.ignored(str(ws_dir / rel))

    assert ignored("build/out.py")  # a folder pattern hides what is inside
    assert ignored("pkg/build/x.py")  # unanchored: at any depth
    assert ignored("a.log") and ignored("pkg/b.log")
    assert not ignored("keep.log")  # negated
    assert not ignored("pkg/a2.log")  # a deeper file's negation wins
    assert ignored("build/keep.log")  # ...but nothing inside an ignored folder comes back
    assert ignored("rooted.txt") and not ignored("pkg/rooted.txt")  # anchored to its file's folder
    assert ignored("pkg/gen/g.py")  # the nested file's own folder pattern
    assert ignored("scratch.tmp")  # .git/info/exclude
    assert ignored(".git/config")
    assert not ignored("src/app.py") and not ignored("hello.txt")
    assert rules.ignored(str(ws_dir / "build"), is_dir=True)


def test_nothing_is_ignored_outside_a_repository(ws_dir: Path, workspace: Workspace) -> None:
    (ws_dir / ".gitignore").write_text("*.txt\n")
    rules = GitIgnore.for_walk(workspace, str(ws_dir))
    assert rules.repo is None
    assert not rules.ignored(str(ws_dir / "hello.txt"))


def test_a_symlinked_ignore_file_is_not_followed(ws_dir: Path, workspace: Workspace, outside: Path) -> None:
    (ws_dir / ".git").mkdir()
    (outside / "rules").write_text("*.py\n")
    (ws_dir / ".gitignore").symlink_to(outside / "rules")
    rules = GitIgnore.for_walk(workspace, str(ws_dir))
    assert not rules.ignored(str(ws_dir / "src" / "app.py"))


@pytest.mark.parametrize("use_rg", [False, True], ids=["python", "ripgrep"])
def test_grep_skips_ignored_files(workspace: Workspace, ws_dir: Path, use_rg: bool) -> None:
    grep = Grep(use_ripgrep=use_rg)
    if use_rg and grep.ripgrep(workspace) is None:
        pytest.skip("ripgrep (rg) is not installed; the Python walk is tested")
    _repo(ws_dir)
    reg = ToolRegistry(workspace, mode=PermissionMode.FULL_AUTO, tools=[grep])
    r = reg.execute("grep", {"pattern": "needle"})
    assert r.ok, r.error
    found = sorted(line.split(":")[0] for line in r.output.splitlines())
    assert found == ["keep.log", "pkg/a2.log", "pkg/rooted.txt"], r.output


def test_grep_searches_ignored_names_outside_a_repository(workspace: Workspace, ws_dir: Path) -> None:
    (ws_dir / ".gitignore").write_text("*.txt\n")
    reg = ToolRegistry(workspace, mode=PermissionMode.FULL_AUTO, tools=[Grep(use_ripgrep=False)])
    assert reg.execute("grep", {"pattern": "line one"}).output == "hello.txt:1:line one"


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/*.py", "a/b/c.py", True),
        ("**/*.py", "c.py", True),
        ("*.py", "a/c.py", False),
        ("*", ".env", True),
        ("src/**", "src/a/b", True),
        ("a/**/b", "a/b", True),
        ("a/[!b]c", "a/xc", True),
        ("a/[!b]c", "a/bc", False),
        ("a?c", "a/c", False),
        ("x[", "x[", True),
        ("*.{py,md}", "README.md", True),
        ("*.{py,md}", "x.txt", False),
    ],
)
def test_compile_glob(pattern: str, path: str, matches: bool) -> None:
    assert (compile_glob(pattern).fullmatch(path) is not None) is matches


def test_glob_brace_limit_and_prefix(registry: ToolRegistry) -> None:
    with pytest.raises(GlobError):
        compile_glob("{a,b}" * 12)
    r = registry.execute("glob", {"pattern": "{a,b}" * 12})
    assert not r.ok and "too many" in (r.error or "")
    assert literal_prefix("src/app/**/*.py") == "src/app"
    assert literal_prefix("src/{a,b}/*.py") == "src"
