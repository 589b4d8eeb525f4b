"""Resource limits for one shell command: wall time, output, processes, memory, file size, disk.

Process counts: RLIMIT_NPROC is ignored by the kernel for uid 0, and mkcode (and CI) often run
as root, so the process cap is a fresh cgroup with `pids.max` (cgroup v1 or v2), created as a
child of mkcode's own cgroup so the host's limits are untouched. For non-root users RLIMIT_NPROC
is also set (via prlimit in the child), to the user's current process count plus the budget, so it
never hurts what the user already runs. Everything here is best effort and says what it could not apply.
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class ShellLimits:
    default_timeout_s: float = 120.0
    max_timeout_s: float = 600.0
    output_chars: int = 30_000  # what the model sees: head and tail, with a marker between
    flood_bytes: int = 64 * 1024 * 1024  # a command that prints this much is stopped
    max_processes: int = 512
    memory_bytes: int | None = 8 * GIB
    file_size_bytes: int | None = 8 * GIB  # RLIMIT_FSIZE: one runaway file cannot fill the disk
    # Net growth of the workspace's filesystems while one command runs (disk.DiskWatch), in bytes
    # and in files (inodes); a single file is also capped at disk_bytes by RLIMIT_FSIZE.
    disk_bytes: int | None = 2 * GIB
    disk_files: int | None = 1_000_000
    tmp_bytes: int | None = 1 * GIB  # size of each tmpfs the sandbox mounts (/tmp, the empty $HOME...)

    @property
    def file_limit_bytes(self) -> int | None:
        """RLIMIT_FSIZE: the per-file cap, never above the disk budget."""
        caps = [c for c in (self.file_size_bytes, self.disk_bytes) if c]
        return min(caps) if caps else None


def _cgroup_mounts() -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """v1 controller -> (mount point, mount root), and the v2 (mount point, root) if any."""
    v1: dict[str, tuple[str, str]] = {}
    v2: tuple[str, str] | None = None
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return v1, v2
    for line in lines:
        pre, _, post = line.partition(" - ")
        fields = pre.split()
        post_fields = post.split()
        if len(fields) < 5 or len(post_fields) < 3:
            continue
        fstype, super_opts = post_fields[0], post_fields[2]
        root, mount_point = fields[3], fields[4]
        if fstype == "cgroup":
            for opt in super_opts.split(","):
                v1.setdefault(opt, (mount_point, root))
        elif fstype == "cgroup2" and v2 is None:
            v2 = (mount_point, root)
    return v1, v2


def _own_cgroups() -> tuple[dict[str, str], str | None]:
    """v1 controller -> our cgroup path, and our v2 path."""
    v1: dict[str, str] = {}
    v2: str | None = None
    try:
        text = Path("/proc/self/cgroup").read_text(encoding="utf-8")
    except OSError:
        return v1, v2
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        for c in controllers.split(","):
            v1[c] = path
    return v1, v2


def _join(mount: tuple[str, str], path: str) -> str:
    mount_point, root = mount
    if root != "/" and path.startswith(root):
        path = path[len(root) :]
    return os.path.join(mount_point, path.lstrip("/"))


@dataclass
class CgroupJail:
    """Fresh cgroups holding one command's processes; removed by cleanup()."""

    dirs: list[str] = field(default_factory=list)
    pids_dir: str | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, limits: ShellLimits) -> CgroupJail:
        jail = cls()
        name = f"mkcode-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        v1_mounts, v2_mount = _cgroup_mounts()
        v1_paths, v2_path = _own_cgroups()
        wanted = {"pids": str(limits.max_processes)}
        if limits.memory_bytes:
            wanted["memory"] = str(limits.memory_bytes)
        for controller, value in wanted.items():
            if controller in v1_mounts and controller in v1_paths:
                d = os.path.join(_join(v1_mounts[controller], v1_paths[controller]), name)
                knob = "pids.max" if controller == "pids" else "memory.limit_in_bytes"
                jail._try_make(d, {knob: value}, controller)
            elif v2_mount is not None and v2_path is not None:
                parent = _join(v2_mount, v2_path)
                d = os.path.join(parent, name)
                knob = "pids.max" if controller == "pids" else "memory.max"
                with contextlib.suppress(OSError):  # enable the controller for children
                    Path(parent, "cgroup.subtree_control").write_text(f"+{controller}")
                jail._try_make(d, {knob: value}, controller)
            else:
                jail.notes.append(f"no {controller} cgroup controller available")
        return jail

    def _try_make(self, d: str, knobs: dict[str, str], controller: str) -> None:
        try:
            if d not in self.dirs:
                os.mkdir(d)
                self.dirs.append(d)
            for knob, value in knobs.items():
                with open(os.path.join(d, knob), "w") as f:
                    f.write(value)
            if controller == "pids":
                self.pids_dir = d
        except OSError as e:
            self.notes.append(f"could not set a {controller} cgroup limit at {d}: {e.strerror}")

    @property
    def limits_processes(self) -> bool:
        return self.pids_dir is not None

    def pid_limit_hits(self) -> int:
        """How many forks the pids limit refused (pids.events 'max N')."""
        if self.pids_dir is None:
            return 0
        try:
            for line in Path(self.pids_dir, "pids.events").read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill_all(self) -> None:
        """SIGKILL whatever is still in the jail (processes that escaped the process group)."""
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                for pid in Path(d, "cgroup.procs").read_text(encoding="utf-8").split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), 9)

    def cleanup(self, wait_s: float = 2.0) -> None:
        deadline = time.monotonic() + wait_s
        for d in reversed(self.dirs):
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        self.notes.append(f"cgroup {d} still busy; left behind")
                        break
                    self.kill_all()
                    time.sleep(0.02)
        self.dirs.clear()


def _user_process_count(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
    return count


def wrap_with_limits(
    argv: list[str], limits: ShellLimits, jail: CgroupJail | None
) -> tuple[list[str], list[str]]:
    """Prefix argv so the child joins the jail and lowers its rlimits before exec'ing the command.

    Done with `sh` and util-linux `prlimit` rather than a Python preexec_fn, which can deadlock
    in a multi-threaded program (the TUI). Returns (argv, notes).
    """
    notes: list[str] = []
    steps: list[str] = []
    if jail is not None:
        steps += [
            f"{{ echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))}; }} 2>/dev/null" for d in jail.dirs
        ]
    prlimit = trusted_prlimit()
    prefix: list[str] = []
    if prlimit is None:
        notes.append("prlimit (util-linux) not found: file-size and process rlimits not set")
        steps.append("ulimit -c 0 2>/dev/null")
    else:
        prefix = [prlimit, "--core=0"]
        if limits.file_limit_bytes:
            prefix.append(f"--fsize={_capped(resource.RLIMIT_FSIZE, limits.file_limit_bytes)}")
        if os.geteuid() != 0:  # the kernel ignores RLIMIT_NPROC for root
            budget = _user_process_count(os.geteuid()) + limits.max_processes
            prefix.append(f"--nproc={_capped(resource.RLIMIT_NPROC, budget)}")
        prefix.append("--")
    script = "; ".join([*steps, 'exec "$@"'])
    return ["/bin/sh", "-c", script, "mkcode-limits", *prefix, *argv], notes


def trusted_prlimit() -> str | None:
    """prlimit from the system's own directories only. It runs on the host, before the sandbox
    exists, so one found through $PATH (an activated workspace .venv/bin, say) could be a file a
    sandboxed command planted there."""
    system_path = os.pathsep.join([os.confstr("CS_PATH") or "/bin:/usr/bin", "/usr/sbin", "/sbin"])
    found = shutil.which("prlimit", path=system_path)
    return os.path.realpath(found) if found else None


def _capped(which: int, value: int) -> int:
    """`value`, but never above the current hard limit (raising it would fail)."""
    _, hard = resource.getrlimit(which)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)
