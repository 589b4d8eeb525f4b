"""File operations on checked paths, done through directory descriptors (see fdwalk).

Workspace.resolve() checks a path; these helpers then reach it from the root's descriptor one
component at a time without following symlinks, so a concurrent swap of a component for a
symlink makes them fail instead of reading or writing outside the workspace.
Writes are atomic: a temp file in the same directory (created with dir_fd), fsync'd, then renamed
over the target with src_dir_fd/dst_dir_fd, keeping the old file's mode (and owner, when running
as root).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator

from mkcode.tools import fdwalk
from mkcode.tools.workspace import PathError, ResolvedPath, Workspace, describe_file_type

# Refuse to load more than this into memory for an edit or a write.
MAX_EDIT_BYTES = 10 * 1024 * 1024


@contextlib.contextmanager
def open_regular_file(ws: Workspace, rp: ResolvedPath) -> Iterator[tuple[int, os.stat_result]]:
    """Open a resolved path read-only; yields (fd, fstat). Never blocks on FIFOs."""
    with fdwalk.open_file(ws, rp.path) as (fd, st):
        yield fd, st


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
    with fdwalk.open_parent(ws, rp.path, create=True) as (dfd, name):
        try:
            _write_in(dfd, name, data, shown)
        except OSError as e:
            raise PathError(f"cannot write {shown}: {e.strerror}") from None


def _write_in(dfd: int, name: str, data: bytes, shown: str) -> None:
    old = _lstat_at(dfd, name)
    if old is not None:
        if not stat.S_ISREG(old.st_mode):
            raise PathError(f"{shown} is {describe_file_type(old.st_mode)}; refused")
        if old.st_nlink > 1:
            raise PathError(f"{shown} has {old.st_nlink} hard links; writing it is refused")
    tmp = f".{name}.mkcode-{secrets.token_hex(6)}.tmp"
    # 0o666 minus the umask is what a plain open() would give a new file.
    tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
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
        # rename() replaces a symlink planted at `name` rather than following it.
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


def _lstat_at(dfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
