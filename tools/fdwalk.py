"""Opening, creating and walking workspace paths from directory descriptors, never by path string.

Workspace.resolve() *checks* a path (symlinks resolved, confinement, protection). Using the checked
path must not let the kernel resolve the string again: a concurrent process (a sandboxed command
still running, another tool call) could have swapped a directory for a symlink in between, and a
plain open(path) would follow it out of the workspace. So every use here starts from the root's
descriptor and opens one component at a time with O_NOFOLLOW (O_DIRECTORY for directories),
creates with mkdir(name, dir_fd=...) and renames with src_dir_fd/dst_dir_fd. The checked path is
symlink-free, so a component that has become a symlink makes the open fail (ELOOP/ENOTDIR): a race
can cause a refusal, never an escape. Walks list a directory through its descriptor and enter
subdirectories the same way; symlinks met during a walk are reported or skipped, never followed.

`race_hook` is a test seam: it is called between each check and the use that follows, so tests
can swap a directory for a symlink at exactly that moment.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mkcode.tools.workspace import PathError, Workspace, describe_file_type

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
MAX_DEPTH = 256  # directory levels a walk enters

# Called as race_hook(event, absolute_path) between a check and its use; None outside tests.
race_hook: Callable[[str, str], None] | None = None


def _race(event: str, path: str) -> None:
    if race_hook is not None:
        race_hook(event, path)


def _moved(ws: Workspace, path: str, err: OSError) -> PathError:
    shown = ws.display(path)
    if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return PathError(
            f"{shown} changed while it was being opened (a directory on the way is now a symlink or "
            "not a directory); refused"
        )
    return PathError(f"cannot open {shown}: {err.strerror}")


def _components(ws: Workspace, path: str) -> tuple[str, list[str]]:
    root = ws.root_of(path)
    if root is None:
        raise PathError(f"{ws.display(path)} is outside the workspace; refused")
    rel = os.path.relpath(path, root)
    parts = [] if rel == os.curdir else rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise PathError(f"{ws.display(path)} is not a normalised path; refused")
    return root, parts


def _open_root(ws: Workspace, root: str) -> int:
    """The root's descriptor; refused if the root is no longer the directory the session began in."""
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError as e:
        raise PathError(f"cannot open the workspace root {ws.display(root)}: {e.strerror}") from None
    st = os.fstat(fd)
    expected = ws.root_ids.get(root)
    if expected is not None and (st.st_dev, st.st_ino) != expected:
        os.close(fd)
        raise PathError(f"the workspace root {ws.display(root)} was replaced by another directory; refused")
    return fd


def _descend(ws: Workspace, root: str, parts: list[str], shown_path: str) -> int:
    """A descriptor for root/parts..., each component opened no-follow from its parent's fd."""
    fd = _open_root(ws, root)
    try:
        for name in parts:
            nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as e:
        os.close(fd)
        raise _moved(ws, shown_path, e) from None
    return fd


@contextlib.contextmanager
def open_dir(ws: Workspace, path: str) -> Iterator[int]:
    """A directory descriptor for a checked, symlink-free path inside the workspace."""
    root, parts = _components(ws, path)
    _race("open_dir", path)
    fd = _descend(ws, root, parts, path)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_parent(ws: Workspace, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """(descriptor of the parent directory, final name) for a checked path.

    With `create`, missing parent directories are made one level at a time: mkdir(name, dir_fd)
    then open(name, O_NOFOLLOW | O_DIRECTORY, dir_fd), so a directory swapped for a symlink
    between the two is refused, never entered.
    """
    root, parts = _components(ws, path)
    if not parts:
        raise PathError(f"{ws.display(path)} is the workspace root")
    *dirs, name = parts
    _race("open_parent", path)
    fd = _open_root(ws, root)
    cur = root
    try:
        for comp in dirs:
            cur = os.path.join(cur, comp)
            try:
                nxt = os.open(comp, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(comp, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise PathError(f"cannot create directory {ws.display(cur)}: {e.strerror}") from None
                _race("mkdir", cur)
                nxt = os.open(comp, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as e:
        os.close(fd)
        raise _moved(ws, cur, e) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        yield fd, name
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_file(ws: Workspace, path: str) -> Iterator[tuple[int, os.stat_result]]:
    """Open a checked regular file read-only: (fd, fstat). Never blocks on a FIFO."""
    with open_parent(ws, path) as (dfd, name):
        _race("open_file", path)
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise _moved(ws, path, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathError(f"{ws.display(path)} is {describe_file_type(st.st_mode)}; refused")
        yield fd, st
    finally:
        os.close(fd)


# -- walks ----------------------------------------------------------------------------------------


@dataclass
class WalkStats:
    """What a walk left out: protected (secret) entries, unreadable directories, symlinks."""

    secret_skipped: int = 0
    unreadable: int = 0

    def notes(self) -> list[str]:
        out = []
        if self.secret_skipped:
            out.append(f"[{self.secret_skipped} protected entries (credentials, keys, histories) skipped]")
        if self.unreadable:
            out.append(f"[{self.unreadable} directories could not be read]")
        return out


@dataclass(frozen=True)
class Entry:
    """One entry met by a walk. `dir_fd` is valid only until the walk moves on."""

    rel: str  # relative to the walk's start, '/'-separated
    path: str  # absolute (symlink-free: the walk never follows links)
    name: str
    dir_fd: int
    kind: str  # "file", "dir", "symlink", "other"


@dataclass
class SecretFilter:
    """The secret entries at or below a directory: O(1) per entry during a walk."""

    entries: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def below(cls, ws: Workspace, start: str) -> SecretFilter:
        prot = ws.protected
        base = start.rstrip("/") + "/"
        return cls(frozenset(e for e in prot.secret if e.startswith(base)))

    def hides(self, path: str) -> bool:
        return path in self.entries


def _kind(entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return "symlink"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "other"


def list_entries(fd: int) -> list[tuple[str, str]]:
    """(name, kind) of a directory's entries through its descriptor, sorted by name bytes."""
    with os.scandir(fd) as it:
        found = [(e.name, _kind(e)) for e in it]
    found.sort(key=lambda t: os.fsencode(t[0]))
    return found


def walk(
    ws: Workspace,
    start: str,
    *,
    skip_dirs: frozenset[str] = frozenset(),
    stats: WalkStats | None = None,
) -> Iterator[Entry]:
    """Every entry below the checked directory `start`, depth first, sorted by name.

    Subdirectories are entered by open(name, O_NOFOLLOW | O_DIRECTORY, dir_fd=parent); symlinks are
    yielded (kind "symlink") and never followed; secret entries are skipped and counted. Iterative,
    holding one descriptor per level, at most MAX_DEPTH levels (deeper directories are counted as
    unreadable): a hostile tree cannot exhaust the stack or the descriptor table.
    """
    stats = stats if stats is not None else WalkStats()
    secrets_below = SecretFilter.below(ws, start)
    with open_dir(ws, start) as top:
        fd = os.dup(top)
    # One frame per open directory: (fd, absolute path, relative path, remaining entries).
    stack: list[tuple[int, str, str, Iterator[tuple[str, str]]]] = []
    try:
        try:
            stack.append((fd, start, "", iter(list_entries(fd))))
        except OSError:
            os.close(fd)
            stats.unreadable += 1
            return
        while stack:
            dfd, path, rel, remaining = stack[-1]
            item = next(remaining, None)
            if item is None:
                os.close(dfd)
                stack.pop()
                continue
            name, kind = item
            child = os.path.join(path, name)
            child_rel = f"{rel}/{name}" if rel else name
            if secrets_below.hides(child):
                stats.secret_skipped += 1
                continue
            if kind != "dir":
                yield Entry(child_rel, child, name, dfd, kind)
                continue
            if name in skip_dirs:
                continue
            if len(stack) >= MAX_DEPTH:
                stats.unreadable += 1
                continue
            _race("walk_enter", child)
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=dfd)
            except OSError:
                # Gone, unreadable, or swapped for a symlink since it was listed: not entered.
                stats.unreadable += 1
                continue
            try:
                entries = list_entries(sub)
            except OSError:
                os.close(sub)
                stats.unreadable += 1
                continue
            stack.append((sub, child, child_rel, iter(entries)))
    finally:
        for dfd, *_ in stack:
            os.close(dfd)


def open_entry_file(entry: Entry) -> int | None:
    """Open a walked file no-follow from its directory's fd; None if it is no longer a regular file."""
    _race("walk_open", entry.path)
    try:
        fd = os.open(entry.name, FILE_FLAGS, dir_fd=entry.dir_fd)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None
