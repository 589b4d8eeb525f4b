"""Kernel interfaces from inside the sandbox: tunables, /sys, root-only files, the uid.

When mkcode runs as root, a user namespace only relabels the uid: permission checks still see
host uid 0, so a root-only file or a 0644 /proc/sys entry is open to the sandbox by owner bits.
The mount plan makes these read-only or masks them; Landlock confines writes on top. Cases
marked with the `layers` fixture run twice: with every layer and with Landlock off.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from mkcode.tools.sandbox import bwrap as bwrap_module

from .conftest import IS_ROOT, SandboxRun, py

CORE_PATTERN = "/proc/sys/kernel/core_pattern"


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


@pytest.mark.parametrize("path", [CORE_PATTERN, "/proc/self/root/proc/sys/kernel/core_pattern"])
def test_core_pattern_cannot_be_written(sandbox: SandboxRun, ws: Path, layers: str, path: str):
    before = _read(CORE_PATTERN)
    (ws / "evil.sh").write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    r = sandbox(
        f"echo '|{ws}/evil.sh %p' > {path}; echo rc=$?; sysctl -w kernel.core_pattern=x; cat {path}", ws
    )
    assert "rc=0" not in r.output, r.output
    assert _read(CORE_PATTERN) == before


def test_landlock_alone_stops_a_proc_sys_write(sandbox: SandboxRun, ws: Path, monkeypatch):
    """With /proc/sys left writable by the mounts, Landlock still refuses the write."""
    if bwrap_module.host_landlock_abi() < 1:
        pytest.skip("this kernel offers no Landlock")
    monkeypatch.setattr(bwrap_module, "PROC_READONLY", ())
    before = _read(CORE_PATTERN)
    r = sandbox(
        f"grep -c ' /proc/sys ' /proc/self/mounts; echo '|/bin/false' > {CORE_PATTERN}; echo rc=$?", ws
    )
    assert r.output.startswith("0\n"), r.output  # the read-only bind is really gone in this run
    assert "rc=1" in r.output and "Permission denied" in r.output, r.output
    assert _read(CORE_PATTERN) == before


def test_proc_sys_is_a_read_only_mount(sandbox: SandboxRun, ws: Path):
    r = sandbox("grep -E ' /proc/(sys|irq|bus|fs) ' /proc/self/mountinfo", ws)
    mounts = {line.split()[4]: line.split()[5] for line in r.output.splitlines() if line.count(" ") > 5}
    assert "/proc/sys" in mounts, r.output
    assert all(opts.split(",")[0] == "ro" for opts in mounts.values()), mounts


def test_sysrq_trigger_cannot_be_written(sandbox: SandboxRun, ws: Path, layers: str):
    if not os.path.exists("/proc/sysrq-trigger"):
        pytest.skip("this kernel has no /proc/sysrq-trigger (CONFIG_MAGIC_SYSRQ off)")
    r = sandbox("echo h > /proc/sysrq-trigger; echo rc=$?", ws)  # 'h' only prints help, if it got through
    assert "rc=0" not in r.output, r.output


def test_sys_is_read_only(sandbox: SandboxRun, ws: Path, layers: str):
    mtu = "/sys/class/net/lo/mtu"
    before = _read(mtu)
    r = sandbox(
        f"echo {before.strip()} > {mtu}; echo rc=$?; "
        "echo $$ > /sys/fs/cgroup/cgroup.procs; echo rc=$?; "
        "echo 1 > /sys/kernel/mm/ksm/run; echo rc=$?",
        ws,
    )
    assert "rc=0" not in r.output, r.output
    assert "Read-only file system" in r.output
    assert _read(mtu) == before


def test_shadow_is_not_readable(sandbox: SandboxRun, ws: Path, layers: str):
    r = sandbox("cat /etc/shadow /etc/gshadow; head -c 300 /etc/shadow | od -c | head -3", ws)
    assert "root:" not in r.output, r.output
    if IS_ROOT:
        first = _read("/etc/shadow").split("\n", 1)[0]
        assert first not in r.output


def test_every_root_only_file_in_etc_is_masked(sandbox: SandboxRun, ws: Path):
    """Not a fixed list: a root-only file that appeared a moment ago is masked too."""
    if not IS_ROOT:
        pytest.skip("only as root: for other users the kernel already refuses root-only files")
    secret = f"ETC-SECRET-{uuid.uuid4().hex}"
    path = Path(f"/etc/mkcode-test-{uuid.uuid4().hex}")
    folder = Path(f"/etc/mkcode-test-dir-{uuid.uuid4().hex}")
    try:
        path.write_text(secret + "\n")
        os.chmod(path, 0o600)
        folder.mkdir(mode=0o700)
        (folder / "inner.conf").write_text(secret + "\n")
        os.chmod(folder / "inner.conf", 0o644)  # readable file in a root-only folder
        r = sandbox(f"cat {path} {folder}/inner.conf; echo LISTING; ls -A {folder}", ws)
        assert secret not in r.output, r.output
        assert "inner.conf" not in r.output.split("LISTING", 1)[1], r.output
        assert path.read_text() == secret + "\n"
    finally:
        path.unlink(missing_ok=True)
        if folder.exists():
            (folder / "inner.conf").unlink(missing_ok=True)
            folder.rmdir()


def test_kernel_memory_and_timers_are_masked(sandbox: SandboxRun, ws: Path):
    present = [
        p for p in ("/proc/timer_list", "/proc/kmsg", "/proc/kallsyms", "/proc/keys") if os.path.exists(p)
    ]
    if not present:
        pytest.skip("none of the masked /proc files exists on this kernel")
    r = sandbox("for f in " + " ".join(present) + "; do timeout 1 head -c 200 $f | wc -c; done", ws)
    counts = [line.strip() for line in r.output.splitlines() if line.strip().isdigit()]
    assert counts == ["0"] * len(present), r.output


def test_uid_inside_is_mapped_to_a_non_root_id(sandbox: SandboxRun, ws: Path):
    r = sandbox("cat /proc/self/uid_map /proc/self/gid_map; id -u", ws)
    maps = [line.split() for line in r.output.splitlines() if len(line.split()) == 3]
    assert len(maps) == 2 and all(m[0] != "0" and m[2] == "1" for m in maps), r.output  # one id, not 0
    assert r.output.split()[-1] == maps[0][0] and maps[0][0] == str(os.getuid() or 1000)


def test_landlock_confines_writes_to_the_allowed_places(sandbox: SandboxRun, ws: Path):
    """/dev is a private writable tmpfs to the mounts; only Landlock stops files appearing there."""
    if bwrap_module.host_landlock_abi() < 1:
        pytest.skip("this kernel offers no Landlock")
    r = sandbox(
        "mkdir /dev/mkcode-x; echo rc=$?; touch /dev/evil; echo rc=$?; "
        "echo ok > ws-file && echo ok > /tmp/t && echo ok > /dev/null && echo ok > $HOME/h && echo ALLOWED",
        ws,
    )
    assert r.output.count("rc=1") == 2 and "Permission denied" in r.output, r.output
    assert "ALLOWED" in r.output
    assert (ws / "ws-file").read_text() == "ok\n"


def test_landlock_scopes_signals_to_the_sandbox(sandbox: SandboxRun, ws: Path):
    """pid 1 of the sandbox (bubblewrap's init) lies outside the Landlock domain (ABI 6+)."""
    if bwrap_module.host_landlock_abi() < 6:
        pytest.skip("this kernel's Landlock has no signal scoping (ABI < 6)")
    code = "import os\ntry:\n    os.kill(1, 0); print('SIGNALLED')\nexcept OSError as e: print('refused', e.errno)\n"
    r = sandbox(py(code), ws)
    assert "refused 1" in r.output, r.output
