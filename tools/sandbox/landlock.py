"""Landlock, the sandbox's second layer: after bubblewrap's mounts, writes are confined by the kernel.

bubblewrap runs this file as a standalone script (`python -I -S landlock.py RW... -- COMMAND`);
it creates a Landlock ruleset that handles every write-type access, allows them beneath the given
paths only (the workspace roots, /tmp, the private $HOME and /run, the /dev nodes a command
needs), restricts itself and execs COMMAND. Reads stay as the mount plan makes them. At ABI 6 and
above it also scopes abstract unix sockets and signals to the sandbox's own domain.

Only the standard library is imported (the script runs without site-packages); the host side uses
`landlock_abi()` to decide whether to add the launcher and to report the layer's state.
"""

from __future__ import annotations

import _signal  # the C module: `signal` would import enum, a few ms per command
import ctypes
import os
import struct
import sys

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_WRITE_ABI1 = (
    ACCESS_FS_WRITE_FILE
    | ACCESS_FS_REMOVE_DIR
    | ACCESS_FS_REMOVE_FILE
    | ACCESS_FS_MAKE_CHAR
    | ACCESS_FS_MAKE_DIR
    | ACCESS_FS_MAKE_REG
    | ACCESS_FS_MAKE_SOCK
    | ACCESS_FS_MAKE_FIFO
    | ACCESS_FS_MAKE_BLOCK
    | ACCESS_FS_MAKE_SYM
)
# Rights that apply to a file (a rule on a non-directory may only grant these).
_FILE_RIGHTS = ACCESS_FS_WRITE_FILE | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV

# Writable beneath these inside every sandbox (besides the workspace roots and the private $HOME).
SANDBOX_WRITABLE = (
    "/tmp",
    "/run",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    libc = _libc()
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def handled_write_access(abi: int) -> int:
    handled = _WRITE_ABI1
    if abi >= 2:
        handled |= ACCESS_FS_REFER
    if abi >= 3:
        handled |= ACCESS_FS_TRUNCATE
    if abi >= 5:
        handled |= ACCESS_FS_IOCTL_DEV
    return handled


def scopes(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


class LandlockError(OSError):
    pass


def restrict_writes(writable: list[str]) -> int:
    """Confine this process (and what it execs) to writing beneath `writable`. Returns the ABI
    used; 0 when the kernel has no Landlock (nothing is restricted then)."""
    libc = _libc()
    abi = landlock_abi()
    if abi < 1:
        return 0
    handled = handled_write_access(abi)
    attr = struct.pack("=QQQ", handled, 0, scopes(abi))
    size = 24 if abi >= 6 else 8
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path in writable:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # absent in this sandbox: nothing to allow
            try:
                is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
                allowed = handled if is_dir else handled & _FILE_RIGHTS
                rule = struct.pack("=Qi", allowed, fd)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0) < 0:
                    raise LandlockError(ctypes.get_errno(), f"landlock_add_rule {path} failed")
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
            raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) < 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def launcher_argv(python: str, writable: list[str], command: list[str]) -> list[str]:
    """How bubblewrap starts `command` under this launcher."""
    return [python, "-I", "-S", os.path.abspath(__file__), *writable, "--", *command]


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: landlock.py WRITABLE_PATH... -- COMMAND...", file=sys.stderr)
        return 2
    split = argv.index("--")
    writable, command = argv[:split], argv[split + 1 :]
    if not command:
        print("landlock.py: no command", file=sys.stderr)
        return 2
    try:
        restrict_writes([*SANDBOX_WRITABLE, *writable])
    except OSError as e:  # the host saw Landlock, so failing here is unexpected: fail closed
        print(f"mkcode sandbox: Landlock could not be applied ({e}); command not run", file=sys.stderr)
        return 126
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # Python ignores these; the command must not inherit it
        _signal.signal(sig, _signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"mkcode sandbox: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
