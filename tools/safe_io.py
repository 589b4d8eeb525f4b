"""File operations that re-check confinement on the opened descriptor.

Workspace.resolve() checks a path; these helpers then open it without following symlinks and ask
the kernel (via /proc/self/fd) where the descriptor really points, so a concurrent swap of a
component for a symlink cannot redirect a read or a write outside the workspace.
Writes are atomic: a temp file in the same directory, fsync'd, then renamed over the target,
keeping the old file's mode (and owner, when running as root).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator

from mkcode.tools.workspace import PathError, ResolvedPath, Workspace, describe_file_type

# Refuse to load more than this into memory for an edit or a write.
MAX_EDIT_BYTES = 10 * 1024 * 1024


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _check_fd_inside(ws: Workspace, fd: int, shown: str) -> None:
    where = _fd_path(fd)
    if not ws.contains(where):
        raise PathError(f"{shown} was redirected to {where} while opening; refused")


@contextlib.contextmanager
def open_regular_file(ws: Workspace, rp: ResolvedPath) -> Iterator[tuple[int, os.stat_result]]:
    """Open a resolved path read-only; yields (fd, fstat). Never blocks on FIFOs."""
    shown = ws.display(rp.path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(rp.path, flags)
    except OSError as e:
        raise PathError(f"cannot open {shown}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathError(f"{shown} is {describe_file_type(st.st_mode)}; refused")
        _check_fd_inside(ws, fd, shown)
        yield fd, st
    finally:
        os.close(fd)


def read_bytes(ws: Workspace, rp: ResolvedPath, limit: int = MAX_EDIT_BYTES) -> bytes:
    """Whole content of a regular file, refusing files larger than `limit`."""
    with open_regular_file(ws, rp) as (fd, st):
        if st.st_size > limit:
            raise PathError(f"{ws.display(rp.path)} is {st.st_size} bytes, over the {limit}-byte limit")
        chunks = []
        total = 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:
                raise PathError(f"{ws.display(rp.path)} grew past the {limit}-byte limit while reading")
            chunks.append(chunk)
        return b"".join(chunks)


def atomic_write(ws: Workspace, rp: ResolvedPath, data: bytes) -> None:
    """Replace (or create) the file at `rp` with `data` atomically, creating parent directories."""
    shown = ws.display(rp.path)
    parent, name = os.path.split(rp.path)
    _make_parents(ws, parent)
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_fd_inside(ws, dfd, shown)
        old = _lstat_at(dfd, name)
        if old is not None:
            if not stat.S_ISREG(old.st_mode):
                raise PathError(f"{shown} is {describe_file_type(old.st_mode)}; refused")
            if old.st_nlink > 1:
                raise PathError(f"{shown} has {old.st_nlink} hard links; writing it is refused")
        tmp = f".{name}.mkcode-{secrets.token_hex(6)}.tmp"
        # 0o666 minus the umask is what a plain open() would give a new file.
        tfd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd
        )
        try:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(tfd, view)
                    view = view[n:]
                if old is not None:
                    os.fchmod(tfd, stat.S_IMODE(old.st_mode))
                    if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                        with contextlib.suppress(OSError):
                            os.fchown(tfd, old.st_uid, old.st_gid)
                os.fsync(tfd)
            finally:
                os.close(tfd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    except OSError as e:
        raise PathError(f"cannot write {shown}: {e.strerror}") from None
    finally:
        os.close(dfd)


def _lstat_at(dfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _make_parents(ws: Workspace, parent: str) -> None:
    """mkdir -p for a resolved, confined parent; each new level is checked on creation."""
    missing: list[str] = []
    cur = parent
    while not os.path.lexists(cur):
        missing.append(cur)
        cur = os.path.dirname(cur)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o777)
        except FileExistsError:
            pass
        except OSError as e:
            raise PathError(f"cannot create directory {ws.display(d)}: {e.strerror}") from None
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode):
            raise PathError(f"{ws.display(d)} is {describe_file_type(st.st_mode)}, not a directory")
