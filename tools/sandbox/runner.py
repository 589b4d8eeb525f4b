"""Running one shell command: in bubblewrap, or (only when explicitly allowed) on the host."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mkcode.tools.sandbox.bwrap import SandboxCommand, build_command
from mkcode.tools.sandbox.disk import DiskWatch, cap_tmpfs
from mkcode.tools.sandbox.env import check_allow_list, filter_environment
from mkcode.tools.sandbox.limits import CgroupJail, ShellLimits, wrap_with_limits
from mkcode.tools.sandbox.probe import SandboxStatus, probe_sandbox
from mkcode.tools.sandbox.process import ProcessOutcome, run_captured


@dataclass(frozen=True)
class SandboxSettings:
    """How run_shell runs commands. `dangerously_no_sandbox` runs them on the host unasked."""

    dangerously_no_sandbox: bool = False
    bwrap_path: str | None = None
    limits: ShellLimits = field(default_factory=ShellLimits)
    home_allow_ro: tuple[str, ...] = ()  # folders under $HOME (caches, toolchains) visible read-only
    env_allow: tuple[str, ...] = ()  # variable names (or PREFIX*) passed beside env.ALLOWED_NAMES


@dataclass(frozen=True)
class ShellOutcome:
    process: ProcessOutcome
    sandboxed: bool
    processes_limited: bool  # a pids cgroup or RLIMIT_NPROC capped the process count
    pid_limit_hits: int  # forks refused by the process cap
    env_removed: tuple[str, ...]
    env_secret_values: tuple[str, ...]  # allowed names dropped because the value looked like a secret
    notes: tuple[str, ...]
    file_limit_bytes: int | None = None  # RLIMIT_FSIZE the command ran under


def _shell() -> list[str]:
    bash = shutil.which("bash") or ("/bin/bash" if os.path.exists("/bin/bash") else None)
    return [bash, "--noprofile", "--norc", "-c"] if bash else ["/bin/sh", "-c"]


def sandbox_status(settings: SandboxSettings, roots: Sequence[str]) -> SandboxStatus:
    return probe_sandbox(settings.bwrap_path, roots)


def run_shell_command(
    command: str,
    *,
    roots: Sequence[str],
    cwd: str,
    timeout_s: float,
    settings: SandboxSettings,
    sandboxed: bool,
    environ: Mapping[str, str] | None = None,
    cancel: threading.Event | None = None,
) -> ShellOutcome:
    """Run `command` with bash -c. `sandboxed=False` must only come from an explicit approval."""
    limits = settings.limits
    scrubbed = filter_environment(os.environ if environ is None else environ, settings.env_allow)
    env = scrubbed.env
    env["TMPDIR"] = "/tmp"
    env["MKCODE_SANDBOX"] = "1" if sandboxed else "0"
    inner = [*_shell(), command]
    notes: list[str] = [f"env_allow: {p}" for p in check_allow_list(settings.env_allow)]
    sandbox_cmd: SandboxCommand | None = None
    if sandboxed:
        status = sandbox_status(settings, roots)
        if not status.available or status.bwrap is None:
            raise RuntimeError(status.explain())  # callers check first; this is a guard
        sandbox_cmd = build_command(
            status.bwrap, roots, cwd, inner, home_allow_ro=settings.home_allow_ro, env=environ
        )
        argv = sandbox_cmd.argv
        notes += sandbox_cmd.notes
    else:
        argv = inner
    if sandboxed:  # every tmpfs the sandbox mounts is memory a command could fill: give each a size
        argv = cap_tmpfs(argv, status.bwrap, limits.tmp_bytes)
    jail = CgroupJail.create(limits)
    notes += jail.notes
    argv, limit_notes = wrap_with_limits(argv, limits, jail)
    notes += limit_notes
    try:
        outcome = run_captured(
            argv,
            cwd=cwd,
            env=env,
            timeout_s=timeout_s,
            output_chars=limits.output_chars,
            flood_bytes=limits.flood_bytes,
            cancel=cancel,
            disk=DiskWatch(roots, limits.disk_bytes, limits.disk_files),
        )
        jail.kill_all()
        hits = jail.pid_limit_hits()
    finally:
        jail.cleanup()
        if sandbox_cmd is not None:  # protected paths a mount could not pin: undo what was planted
            notes += sandbox_cmd.restore_guarded()
    notes += [n for n in jail.notes if n not in notes]
    return ShellOutcome(
        process=outcome,
        sandboxed=sandboxed,
        processes_limited=jail.limits_processes or os.geteuid() != 0,
        pid_limit_hits=hits,
        env_removed=scrubbed.removed,
        env_secret_values=scrubbed.secret_values,
        notes=tuple(notes),
        file_limit_bytes=limits.file_limit_bytes,
    )
