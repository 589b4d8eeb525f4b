"""The seccomp layer: the filter's rules checked by an emulator, then each refused call tried from
inside the sandbox (and the calls ordinary programs need still working)."""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import tempfile
import uuid
from pathlib import Path

import pytest

from mkcode.tools.sandbox import seccomp
from mkcode.tools.sandbox.runner import SandboxSettings, run_shell_command

from .conftest import PYTHON, SYSCALL_PROLOGUE, SandboxRun, py

# ---------------------------------------------------------------------------------------------
# The filter, run by a classic-BPF emulator (the subset seccomp.py emits).


def run_filter(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == seccomp.BPF_LD | seccomp.BPF_W | seccomp.BPF_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == seccomp.BPF_RET | seccomp.BPF_K:
            return k
        elif code == seccomp.BPF_JMP | seccomp.BPF_JA:
            pc += k
        elif code & 0x07 == seccomp.BPF_JMP:
            op = code & 0xF0
            hit = {seccomp.BPF_JEQ: acc == k, seccomp.BPF_JGE: acc >= k, seccomp.BPF_JSET: bool(acc & k)}[op]
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


EPERM = seccomp.SECCOMP_RET_ERRNO | errno.EPERM
ALLOW = seccomp.SECCOMP_RET_ALLOW
KILL = seccomp.SECCOMP_RET_KILL_PROCESS


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_filter_refuses_every_listed_call(machine: str):
    prog = seccomp.build_filter(machine)
    audit, column = seccomp._ARCHES[machine]
    nr = {name: nums[column] for name, nums in seccomp._NUMBERS.items()}
    for name in seccomp.DENIED_CALLS:
        assert run_filter(prog, nr[name], audit) == EPERM, name
    assert run_filter(prog, nr["clone3"], audit) == seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS
    for flag in (0x80, 0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000):
        assert run_filter(prog, nr["clone"], audit, (flag | 17,)) == EPERM, hex(flag)
    assert run_filter(prog, nr["clone"], audit, (0x3D0F00,)) == ALLOW  # pthread_create's flags
    assert run_filter(prog, nr["clone"], audit, (17,)) == ALLOW  # fork
    assert run_filter(prog, nr["ptrace"], audit, (seccomp.PTRACE_ATTACH, 1)) == EPERM
    assert run_filter(prog, nr["ptrace"], audit, (seccomp.PTRACE_SEIZE, 1)) == EPERM
    assert run_filter(prog, nr["ptrace"], audit, (0,)) == ALLOW  # PTRACE_TRACEME
    assert run_filter(prog, nr["ioctl"], audit, (1, seccomp.TIOCSTI)) == EPERM
    assert run_filter(prog, nr["ioctl"], audit, (1, seccomp.TIOCLINUX)) == EPERM
    assert run_filter(prog, nr["ioctl"], audit, (1, 0x5401)) == ALLOW  # TCGETS
    assert run_filter(prog, nr["socket"], audit, (socket.AF_UNIX, socket.SOCK_STREAM)) == EPERM
    for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):
        assert run_filter(prog, nr["socket"], audit, (family, socket.SOCK_STREAM)) == ALLOW, family
    for family in (0, 3, socket.AF_PACKET, socket.AF_VSOCK, socket.AF_ALG, 0xFFFFFFFF):
        assert run_filter(prog, nr["socket"], audit, (family, socket.SOCK_STREAM)) == EPERM, family
    assert run_filter(prog, 0, audit) == ALLOW  # read (x86_64) / io_setup (aarch64)


def test_filter_kills_foreign_architectures_and_x32():
    prog = seccomp.build_filter("x86_64")
    assert run_filter(prog, 11, 0x40000003) == KILL  # i386 via int 0x80: numbers mean other calls
    assert run_filter(prog, 0x40000000 | 272, seccomp.AUDIT_ARCH_X86_64) == KILL  # x32 unshare
    assert run_filter(seccomp.build_filter("aarch64"), 97, seccomp.AUDIT_ARCH_X86_64) == KILL
    with pytest.raises(seccomp.UnsupportedArchitecture):
        seccomp.build_filter("riscv64")


# ---------------------------------------------------------------------------------------------
# The same calls, made from inside the sandbox.

_PROBE = (
    SYSCALL_PROLOGUE
    + r"""
import json, signal, struct, sys, fcntl, termios, socket
N = json.loads(sys.argv[1])
out = {}
def rec(name, r):
    out[name] = list(r)
def forked(flags):
    r = call(N['clone'], flags | signal.SIGCHLD, 0, 0, 0, 0)
    if r[0] == 0:
        os._exit(0)
    if r[0] > 0:
        os.waitpid(r[0], 0)
    return r
rec('unshare CLONE_NEWUSER', call(N['unshare'], 0x10000000))
rec('unshare CLONE_NEWNS', call(N['unshare'], 0x20000))
rec('setns', call(N['setns'], os.open('/proc/self/ns/mnt', os.O_RDONLY), 0))
rec('clone CLONE_NEWUSER', forked(0x10000000))
rec('clone CLONE_NEWNET', forked(0x40000000))
args = struct.pack('=11Q', 0, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, 0)
r = call(N['clone3'], args, len(args))
if r[0] == 0:
    os._exit(0)
rec('clone3', r)
rec('mount', call(N['mount'], b'none', b'/tmp', b'tmpfs', 0, None))
rec('umount2', call(N['umount2'], b'/tmp', 2))
rec('pivot_root', call(N['pivot_root'], b'/tmp', b'/tmp'))
rec('open_tree', call(N['open_tree'], -100, b'/tmp', 1))
rec('move_mount', call(N['move_mount'], -100, b'/tmp', -100, b'/mnt', 0))
rec('fsopen', call(N['fsopen'], b'tmpfs', 0))
rec('fsconfig', call(N['fsconfig'], 3, 0, None, None, 0))
rec('fsmount', call(N['fsmount'], 3, 0, 0))
rec('fspick', call(N['fspick'], -100, b'/tmp', 0))
rec('mount_setattr', call(N['mount_setattr'], -100, b'/tmp', 0, None, 0))
rec('keyctl', call(N['keyctl'], 0, -3, 0))
rec('add_key', call(N['add_key'], b'user', b'mkcode', b'x', 1, -3))
rec('request_key', call(N['request_key'], b'user', b'mkcode', None, -3))
rec('bpf', call(N['bpf'], 0, bytes(128), 128))
attr = struct.pack('=IIQQQQQ', 1, 112, 0, 0, 0, 0, (1 << 5) | (1 << 6)) + bytes(64)
rec('perf_event_open', call(N['perf_event_open'], attr, 0, -1, -1, 0))
rec('userfaultfd', call(N['userfaultfd'], 1))
rec('kexec_load', call(N['kexec_load'], 0, 0, None, 0))
rec('kexec_file_load', call(N['kexec_file_load'], -1, -1, 0, b'', 0))
rec('init_module', call(N['init_module'], None, 0, b''))
rec('finit_module', call(N['finit_module'], 0, b'', 0))
rec('delete_module', call(N['delete_module'], b'mkcode_none', 0))
rec('io_uring_setup', call(N['io_uring_setup'], 1, bytes(120)))
rec('io_uring_enter', call(N['io_uring_enter'], 0, 0, 0, 0, None, 0))
rec('io_uring_register', call(N['io_uring_register'], 0, 0, None, 0))
rec('syslog', call(N['syslog'], 3, ctypes.create_string_buffer(4096), 4096))
rec('open_by_handle_at', call(N['open_by_handle_at'], -100, struct.pack('=Ii', 8, 1) + bytes(8), 0))
child = os.fork()
if child == 0:
    import time; time.sleep(30); os._exit(0)
rec('ptrace PTRACE_ATTACH', call(N['ptrace'], 16, child, 0, 0))
rec('ptrace PTRACE_SEIZE', call(N['ptrace'], 0x4206, child, 0, 0))
os.kill(child, 9); os.waitpid(child, 0)
rec('socket AF_UNIX', call(N['socket'], 1, 1, 0))
rec('socket AF_UNIX datagram', call(N['socket'], 1, 2, 0))
rec('socket AF_VSOCK', call(N['socket'], 40, 1, 0))
rec('socket AF_ALG', call(N['socket'], 38, 5, 0))
out['ok socket AF_INET6'] = [0 if call(N['socket'], 10, 1, 0)[0] > 0 else -1, 0]
out['ok socket AF_NETLINK'] = [0 if call(N['socket'], 16, 3, 0)[0] > 0 else -1, 0]
# TIOCSTI needs the terminal to be the caller's controlling terminal (else EPERM regardless).
rd, wr = os.pipe()
child = os.fork()
if child == 0:
    os.setsid()
    m, s = os.openpty()
    fcntl.ioctl(s, termios.TIOCSCTTY, 0)
    res = []
    for req in (termios.TIOCSTI, 0x541C):
        try:
            fcntl.ioctl(s, req, b'\x00' * 8 if req == 0x541C else b'x'); res.append([0, 0])
        except OSError as e:
            res.append([-1, e.errno])
    os.write(wr, json.dumps(res).encode()); os._exit(0)
os.close(wr); os.waitpid(child, 0)
tiocsti, tioclinux = json.loads(os.read(rd, 4096))
out['ioctl TIOCSTI'] = tiocsti
out['ioctl TIOCLINUX'] = tioclinux
# still allowed
pid = os.fork()
if pid == 0:
    os._exit(0 if call(N['ptrace'], 0, 0, 0, 0)[0] == 0 else 1)
out['ok ptrace PTRACE_TRACEME'] = [os.waitpid(pid, 0)[1], 0]
pid = os.fork()
if pid == 0:
    os._exit(7)
out['ok fork'] = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) - 7, 0]
a, b = socket.socketpair(); a.send(b'ping'); out['ok socketpair'] = [0 if b.recv(4) == b'ping' else -1, 0]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.bind(('127.0.0.1', 0)); s.listen()
c = socket.create_connection(s.getsockname()); out['ok tcp loopback'] = [0, 0]
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join(); out['ok thread'] = [0, 0]
print('RESULT' + json.dumps(out))
"""
)


@pytest.fixture(scope="module")
def inside(sandbox_available: None) -> dict[str, list[int]]:
    """Run the probe once in a sandbox; name -> [return value, errno]."""
    machine_col = seccomp._ARCHES[os.uname().machine][1]
    numbers = {name: nums[machine_col] for name, nums in seccomp._NUMBERS.items()}
    with tempfile.TemporaryDirectory(prefix="mkcode-seccomp-ws-") as ws:
        script = Path(ws, "probe.py")
        script.write_text(_PROBE)
        out = run_shell_command(
            f"{PYTHON} -I -S probe.py '{json.dumps(numbers)}'",
            roots=[ws],
            cwd=ws,
            timeout_s=60,
            settings=SandboxSettings(),
            sandboxed=True,
        )
    text = out.process.output
    assert "RESULT" in text, text
    return json.loads(text.split("RESULT", 1)[1].splitlines()[0])


REFUSED = [
    "unshare CLONE_NEWUSER",
    "unshare CLONE_NEWNS",
    "setns",
    "clone CLONE_NEWUSER",
    "clone CLONE_NEWNET",
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
    "syslog",
    "ptrace PTRACE_ATTACH",
    "ptrace PTRACE_SEIZE",
    "socket AF_UNIX",
    "socket AF_UNIX datagram",
    "socket AF_VSOCK",
    "socket AF_ALG",
    "ioctl TIOCSTI",
    "ioctl TIOCLINUX",
]


@pytest.mark.parametrize("name", REFUSED)
def test_call_is_refused_inside_the_sandbox(inside: dict[str, list[int]], name: str):
    # EPERM is the filter's answer; several of these calls would otherwise succeed for an
    # unprivileged process (keyctl, perf_event_open, userfaultfd, io_uring_setup, AF_UNIX
    # sockets, attaching to one's own child, TIOCSTI on one's controlling terminal).
    assert inside[name] == [-1, errno.EPERM], (name, inside[name])


def test_clone3_answers_enosys_so_libc_falls_back(inside: dict[str, list[int]]):
    assert inside["clone3"] == [-1, errno.ENOSYS]


@pytest.mark.parametrize(
    "name",
    [
        "ok ptrace PTRACE_TRACEME",
        "ok fork",
        "ok socketpair",
        "ok tcp loopback",
        "ok thread",
        "ok socket AF_INET6",
        "ok socket AF_NETLINK",
    ],
)
def test_ordinary_calls_still_work(inside: dict[str, list[int]], name: str):
    assert inside[name] == [0, 0], (name, inside[name])


def test_host_unix_socket_is_unreachable(sandbox: SandboxRun, ws: Path):
    """A daemon's socket under /var/tmp (outside /tmp and /run, which are private anyway)."""
    d = Path(tempfile.mkdtemp(prefix="mkcode-sock-", dir="/var/tmp"))
    os.chmod(d, 0o777)
    path = str(d / "daemon.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(path)
        os.chmod(path, 0o777)
        srv.listen(5)
        srv.setblocking(False)
        code = (
            "import socket\n"
            "try:\n"
            f"    s = socket.socket(socket.AF_UNIX); s.connect({path!r}); s.send(b'pwn'); print('CONNECTED')\n"
            "except OSError as e: print('refused', e.errno)\n"
        )
        r = sandbox(py(code), ws)
        assert "CONNECTED" not in r.output and f"refused {errno.EPERM}" in r.output, r.output
        with pytest.raises(BlockingIOError):
            srv.accept()  # the daemon saw no connection
    finally:
        srv.close()
        os.unlink(path)
        os.rmdir(d)


def test_host_abstract_unix_socket_is_unreachable(sandbox: SandboxRun, ws: Path):
    name = "\0mkcode-test-" + uuid.uuid4().hex
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(name)
        srv.listen(5)
        srv.setblocking(False)
        code = (
            "import socket\n"
            "try:\n"
            f"    s = socket.socket(socket.AF_UNIX); s.connect({name!r}); print('CONNECTED')\n"
            "except OSError as e: print('refused', e.errno)\n"
        )
        r = sandbox(py(code), ws)
        assert "CONNECTED" not in r.output and "refused" in r.output, r.output
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


def test_filter_is_installed_and_no_capabilities(sandbox: SandboxRun, ws: Path):
    r = sandbox("grep -E '^(Seccomp|CapEff|CapPrm|NoNewPrivs):' /proc/self/status; id -u; id -g", ws)
    fields = dict(line.split(":\t") for line in r.output.splitlines() if ":\t" in line)
    assert fields["Seccomp"] == "2" and fields["NoNewPrivs"] == "1"
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0
    ids = [line for line in r.output.splitlines() if line.isdigit()]
    assert ids and "0" not in ids, r.output  # never uid or gid 0 inside


def test_unshare_tool_cannot_make_a_root_namespace(sandbox: SandboxRun, ws: Path):
    r = sandbox("unshare -Ur id -u; echo rc=$?; unshare -m true; echo rc=$?", ws)
    assert "rc=0" not in r.output, r.output
    assert "\n0\n" not in "\n" + r.output


def test_mount_tool_fails(sandbox: SandboxRun, ws: Path):
    (ws / "mnt").mkdir()
    r = sandbox("mount -t tmpfs none mnt; echo rc=$?; grep -c ' mnt ' /proc/self/mounts", ws)
    assert "rc=0" not in r.output, r.output
