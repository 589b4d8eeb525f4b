"""The workspace: the directories the tools may touch, and the path resolver that confines them.

Every path the model gives is resolved here, symlinks included, by walking it one component at a
time (like realpath, but refusing to pass through /proc, /sys or /dev, whose "magic" links such as
/proc/self/root lead anywhere). The final path must lie inside one of the roots. The file
operations in safe_io then re-check the opened descriptor, so a symlink swapped in between the
check and the use cannot redirect them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from mkcode.tools.protected import ProtectedPaths, Protection, protected_paths
from mkcode.tools.text import display_path, unescape_display_path

# Kernel pseudo-filesystems: never read, written or traversed by the file tools.
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
# Directories the file tools never write into: a writable .git/hooks or .git/config runs code
# outside the sandbox at the next git command, and .mkcode holds mkcode's own project settings.
# (The shell sandbox mounts the same places read-only.)
PROTECTED_DIR_NAMES = (".git", ".mkcode")
_MAX_SYMLINK_HOPS = 40


class PathError(Exception):
    """A path the tools refuse; the message is written for the model."""


class Access(Enum):
    READ = "read"
    LIST = "list"  # a directory
    SEARCH = "search"  # a directory or a regular file
    WRITE = "write"


@dataclass(frozen=True)
class ResolvedPath:
    """A path resolved to an absolute, symlink-free location inside a root."""

    path: str  # absolute, no symlinks (as of resolution); may hold surrogate-escaped bytes
    root: str  # the workspace root containing it
    lstat: os.stat_result | None  # None when nothing exists there yet

    @property
    def exists(self) -> bool:
        return self.lstat is not None

    @property
    def rel(self) -> str:
        rel = os.path.relpath(self.path, self.root)
        return "." if rel == os.curdir else rel


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _is_pseudo(path: str) -> bool:
    return any(_under(path, p) for p in PSEUDO_ROOTS)


def describe_file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "a regular file"


class Workspace:
    """The roots the tools are confined to. The first root is the working directory."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        extra_roots: Sequence[str | os.PathLike[str]] = (),
        protected: ProtectedPaths | None = None,
    ):
        roots: list[str] = []
        for r in (root, *extra_roots):
            real = os.path.realpath(os.fspath(r))
            if not os.path.isdir(real):
                raise ValueError(f"workspace root is not a directory: {r}")
            if real == "/" or _is_pseudo(real):
                raise ValueError(f"refusing {real!r} as a workspace root")
            roots.append(real)
        self.roots: tuple[str, ...] = tuple(roots)
        self._protected = protected
        # (device, inode) of each root when the session began: fdwalk checks the root it opens.
        self.root_ids: dict[str, tuple[int, int]] = {}
        for r in self.roots:
            st = os.stat(r)
            self.root_ids[r] = (st.st_dev, st.st_ino)

    @property
    def protected(self) -> ProtectedPaths:
        """Secret and read-only paths (tools/protected.py); from this process's $HOME when not given."""
        return self._protected if self._protected is not None else protected_paths()

    @property
    def root(self) -> str:
        return self.roots[0]

    def display(self, path: str) -> str:
        """Path as shown to the model: relative to the main root when inside it."""
        if _under(path, self.root):
            rel = os.path.relpath(path, self.root)
            return display_path("." if rel == os.curdir else rel)
        return display_path(path)

    def root_of(self, path: str) -> str | None:
        for r in self.roots:
            if _under(path, r):
                return r
        return None

    def contains(self, path: str) -> bool:
        return self.root_of(path) is not None

    # -- resolution -------------------------------------------------------------------------

    def resolve(self, path: str, access: Access = Access.READ) -> ResolvedPath:
        """Resolve `path` (relative to the main root, or absolute) and check it for `access`."""
        if not isinstance(path, str) or path == "":
            raise PathError("path must be a non-empty string")
        if "\x00" in path:
            raise PathError("path contains a NUL byte")
        # The model may copy back a name we displayed with \xNN escapes for raw bytes.
        alt = unescape_display_path(path)
        try:
            first = self._resolve_once(path, access)
        except PathError as e:
            if alt is None:
                raise
            try:
                return self._resolve_once(alt, access)
            except PathError:
                raise e from None
        if not first.exists and alt is not None:
            try:
                second = self._resolve_once(alt, access)
            except PathError:
                return first
            if second.exists:
                return second
        return first

    def _resolve_once(self, path: str, access: Access) -> ResolvedPath:
        absolute = path if os.path.isabs(path) else os.path.join(self.root, path)
        real = self._walk(absolute)
        root = self.root_of(real)
        if root is None:
            raise PathError(
                f"{display_path(path)!s} resolves to {display_path(real)}, outside the workspace "
                f"({', '.join(display_path(r) for r in self.roots)}); refused"
            )
        try:
            st: os.stat_result | None = os.lstat(real)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise PathError(f"cannot stat {display_path(path)}: {e.strerror}") from None
        if st is None and access is not Access.WRITE:
            raise PathError(f"{display_path(path)} does not exist")
        resolved = ResolvedPath(real, root, st)
        self._check_access(path, resolved, access)
        return resolved

    def _walk(self, absolute: str) -> str:
        """realpath() that refuses pseudo-filesystems on the way; missing tails stay lexical."""
        if _is_pseudo(os.path.normpath(absolute)):
            raise PathError(
                f"{display_path(absolute)} is on a kernel pseudo-filesystem (/proc, /sys, /dev); refused"
            )
        pending = [c for c in absolute.split("/") if c]
        pending.reverse()  # a stack: pop() gives the next component
        cur = "/"
        hops = 0
        missing = False
        while pending:
            comp = pending.pop()
            if comp == ".":
                continue
            if comp == "..":
                cur = os.path.dirname(cur) or "/"
                continue
            nxt = os.path.join(cur, comp)
            if _is_pseudo(nxt):
                raise PathError(
                    f"{display_path(absolute)} passes through {display_path(nxt)} "
                    "(a kernel pseudo-filesystem); refused"
                )
            if missing:
                cur = nxt
                continue
            try:
                st = os.lstat(nxt)
            except FileNotFoundError:
                missing = True
                cur = nxt
                continue
            except NotADirectoryError:
                raise PathError(f"{display_path(cur)} is not a directory") from None
            except OSError as e:
                raise PathError(f"cannot access {display_path(nxt)}: {e.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_SYMLINK_HOPS:
                    raise PathError(f"too many levels of symbolic links in {display_path(absolute)}")
                target = os.readlink(nxt)
                if target.startswith("/"):
                    cur = "/"
                pending.extend(reversed([c for c in target.split("/") if c]))
                continue
            cur = nxt
        return cur

    def _check_access(self, given: str, rp: ResolvedPath, access: Access) -> None:
        shown = display_path(given)
        protection = self.protected.classify(rp.path)
        if protection is Protection.SECRET:
            self._fail(
                f"{shown} is a protected location (credentials, keys, tokens, histories or mkcode's own "
                "configuration and sessions); the tools never read, list or write it"
            )
        if protection is Protection.READONLY and access is Access.WRITE:
            self._fail(
                f"{shown} is read-only to the tools: it is read by programs that later run on the host "
                "(shell start-up files, git/pip/editor configuration, user site-packages, mkcode's own "
                "installation); writes refused"
            )
        st = rp.lstat
        if st is not None:
            mode = st.st_mode
            kind = describe_file_type(mode)
            if access is Access.LIST:
                if not stat.S_ISDIR(mode):
                    self._fail(f"{shown} is {kind}, not a directory")
            elif access is Access.SEARCH:
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    self._fail(f"{shown} is {kind}; only files and directories can be searched")
            elif not stat.S_ISREG(mode):
                self._fail(f"{shown} is {kind}; only regular files can be {access.value}")
            if access is Access.WRITE and st.st_nlink > 1:
                self._fail(
                    f"{shown} has {st.st_nlink} hard links; another link may lie outside the "
                    "workspace, so writing it is refused (copy it to a new file first)"
                )
        if access is Access.WRITE:
            rel_parts = Path(os.path.relpath(rp.path, rp.root)).parts
            if any(p in PROTECTED_DIR_NAMES for p in rel_parts):
                self._fail(
                    f"{shown} is inside a protected directory ({', '.join(PROTECTED_DIR_NAMES)}); writes refused"
                )
            if rp.path == rp.root:
                self._fail(f"{shown} is the workspace root")

    @staticmethod
    def _fail(message: str) -> None:
        raise PathError(message)


def broad_workspace_reason(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> str | None:
    """Why `path` is too broad to be a workspace without asking ($HOME, `/`, a folder holding $HOME).

    None for an ordinary project folder. The front ends ask (y/N) before starting with a reason, and
    `-p` refuses unless --allow-broad-workspace is given.
    """
    env = os.environ if env is None else env
    real = os.path.realpath(os.fspath(path))
    if real == "/":
        return (
            "the workspace would be the whole filesystem (/): the model could read every file mkcode can "
            "read, and its commands could write everywhere you can"
        )
    home = env.get("HOME") or os.path.expanduser("~")
    home = os.path.realpath(home) if home else ""
    if home in ("", "/"):
        return None
    if real == home:
        return (
            f"the workspace would be your home directory ({display_path(home)}): every project, document "
            "and dotfile below it would be readable by the model and writable by its commands "
            "(credentials and start-up files stay protected, but nothing else does)"
        )
    if home.startswith(real.rstrip("/") + "/"):
        return (
            f"the workspace {display_path(real)} contains your home directory ({display_path(home)}): "
            "everything below it would be readable by the model and writable by its commands"
        )
    return None
