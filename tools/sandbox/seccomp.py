"""The seccomp filter bubblewrap installs (`--seccomp FD`) before it runs the sandboxed command.

A classic-BPF program, assembled here (no library): it refuses the system calls that reach past
the namespaces and mounts (new namespaces, mounts, kernel keyrings, eBPF, perf, module and kexec
loading, io_uring, handle-based opens, the kernel log, ptrace attach, terminal input injection)
and the creation
of sockets outside the families the network namespace confines (AF_INET, AF_INET6, AF_NETLINK):
no unix-domain socket, so no host daemon's socket is reachable whatever its path or name
(socketpair(2) stays allowed: pipes between processes of the command), and no AF_VSOCK, which a
network namespace does not isolate (a VM guest would reach its host). Refused calls fail with
EPERM, except clone3, which fails with ENOSYS so that libc falls back to clone(2), whose flags the
filter reads.

Architectures: x86_64 and aarch64. A call made with any other audit architecture (i386 via int
0x80, x32) kills the process: the syscall numbers below would not mean the same calls.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
import threading
from dataclasses import dataclass

from mkcode.tools.sandbox import scratch

# <linux/filter.h>
BPF_LD, BPF_JMP, BPF_RET = 0x00, 0x05, 0x06
BPF_W, BPF_ABS, BPF_K = 0x00, 0x20, 0x00
BPF_JA, BPF_JEQ, BPF_JGE, BPF_JSET = 0x00, 0x10, 0x30, 0x40
# <linux/seccomp.h>
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_OFF_NR, _OFF_ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i  # little-endian: the low 32 bits of args[i]


AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

CLONE_NEW_FLAGS = (
    0x00000080  # CLONE_NEWTIME
    | 0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
AF_UNIX, AF_INET, AF_NETLINK, AF_INET6 = 1, 2, 16, 10
# socket(2) families allowed; everything else (AF_UNIX, AF_VSOCK, AF_ALG, AF_PACKET, ...) refused.
SOCKET_FAMILIES_ALLOWED = (AF_INET, AF_INET6, AF_NETLINK)

# Syscall numbers: (x86_64, aarch64). Calls added after 5.x share one number on every arch.
_NUMBERS: dict[str, tuple[int, int]] = {
    "unshare": (272, 97),
    "setns": (308, 268),
    "clone": (56, 220),
    "clone3": (435, 435),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "open_tree_attr": (467, 467),
    "ptrace": (101, 117),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "open_by_handle_at": (304, 265),
    "syslog": (103, 116),
    "ioctl": (16, 29),
    "socket": (41, 198),
    "fallocate": (285, 47),
}
_ARCHES = {"x86_64": (AUDIT_ARCH_X86_64, 0), "aarch64": (AUDIT_ARCH_AARCH64, 1)}

# Refused whatever their arguments.
DENIED_CALLS = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_tree_attr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "syslog",  # the kernel log (masked in /proc too); readable by anyone where dmesg_restrict=0
)
# Fail with EOPNOTSUPP, as on a filesystem without them: fallocate(2) reserves gigabytes in one
# call, too fast for the disk budget's sampling; libc's posix_fallocate falls back to writing,
# which the budget sees.
UNSUPPORTED_CALLS = ("fallocate",)


@dataclass(frozen=True)
class ArgRule:
    """Refuse `call` when the low 32 bits of argument `arg` equal one of `values` (or, with
    `any_bits`, share a bit with it; or, with `allowed`, equal none of those); else allow it."""

    call: str
    arg: int
    values: tuple[int, ...] = ()
    any_bits: int = 0
    allowed: tuple[int, ...] = ()


ARG_RULES = (
    ArgRule("clone", 0, any_bits=CLONE_NEW_FLAGS),  # flags: any CLONE_NEW*
    ArgRule("ptrace", 0, values=(PTRACE_ATTACH, PTRACE_SEIZE)),  # TRACEME (strace, gdb run) stays
    ArgRule("ioctl", 1, values=(TIOCSTI, TIOCLINUX)),
    ArgRule("socket", 0, allowed=SOCKET_FAMILIES_ALLOWED),
)


class UnsupportedArchitecture(RuntimeError):
    pass


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _ret(value: int) -> bytes:
    return _insn(BPF_RET | BPF_K, value)


def _ld(offset: int) -> bytes:
    return _insn(BPF_LD | BPF_W | BPF_ABS, offset)


def _jeq(k: int, jt: int, jf: int) -> bytes:
    return _insn(BPF_JMP | BPF_JEQ | BPF_K, k, jt, jf)


def build_filter(machine: str | None = None) -> bytes:
    """The filter for `machine` (uname -m; default: this one) as raw struct sock_filter entries."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise UnsupportedArchitecture(
            f"no seccomp filter for architecture {machine!r} (supported: {', '.join(_ARCHES)})"
        )
    audit_arch, column = _ARCHES[machine]
    nr = {name: nums[column] for name, nums in _NUMBERS.items()}
    eperm = _ret(SECCOMP_RET_ERRNO | errno.EPERM)
    prog = [_ld(_OFF_ARCH), _jeq(audit_arch, 1, 0), _ret(SECCOMP_RET_KILL_PROCESS), _ld(_OFF_NR)]
    if machine == "x86_64":  # x32 calls: the same arch word, numbers with bit 30 set
        prog += [_insn(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1), _ret(SECCOMP_RET_KILL_PROCESS)]
    prog += [_jeq(nr["clone3"], 0, 1), _ret(SECCOMP_RET_ERRNO | errno.ENOSYS)]
    for name in DENIED_CALLS:
        prog += [_jeq(nr[name], 0, 1), eperm]
    for name in UNSUPPORTED_CALLS:
        prog += [_jeq(nr[name], 0, 1), _ret(SECCOMP_RET_ERRNO | errno.EOPNOTSUPP)]
    for rule in ARG_RULES:
        # nr matches: load the argument, test it, then return (each call has one rule at most)
        body = [_ld(_arg_low(rule.arg))]
        if rule.any_bits:
            body += [_insn(BPF_JMP | BPF_JSET | BPF_K, rule.any_bits, 1, 0)]
        elif rule.allowed:
            n = len(rule.allowed)  # a match jumps over the JA to ALLOW; no match: JA to EPERM
            body += [_jeq(v, n - i, 0) for i, v in enumerate(rule.allowed)]
            body += [_insn(BPF_JMP | BPF_JA, 1)]
        else:
            n = len(rule.values)
            body += [_jeq(v, n - i, 0) for i, v in enumerate(rule.values)]
        body += [_ret(SECCOMP_RET_ALLOW), eperm]
        prog += [_jeq(nr[rule.call], 0, len(body)), *body]
    prog.append(_ret(SECCOMP_RET_ALLOW))
    if len(prog) > 4096:  # BPF_MAXINSNS
        raise AssertionError("seccomp filter too long")
    return b"".join(prog)


_lock = threading.Lock()
_cached: dict[str, str] = {}


def filter_file() -> str:
    """A file holding this machine's filter, written once per process into scratch.path(); bwrap
    reads it through an inherited descriptor. Rewritten if removed."""
    path = os.path.join(scratch.path(), "filter.bpf")
    with _lock:
        if _cached.get("filter") == path and os.path.isfile(path):
            return path
        data = build_filter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _cached["filter"] = path
        return path
