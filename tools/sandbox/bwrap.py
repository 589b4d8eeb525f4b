"""The bubblewrap command line for one sandboxed command.

Layout inside the sandbox (later mounts cover earlier ones):
  /                  read-only bind of the host root (recursive)
  /dev, /proc        a fresh minimal /dev and a procfs of the new PID namespace; /proc/sys,
                     /proc/sysrq-trigger, /proc/irq, /proc/bus, /proc/fs read-only; kernel memory,
                     keys, timers and the like (/proc/kcore, /proc/kmsg, ...) masked; /sys read-only
                     with its firmware and debug trees masked
  /tmp, /run         private tmpfs
  /root, /home,      empty tmpfs: deny by default. Toolchains found there (~/.pyenv, ~/.cargo, ...),
  $HOME              the user's `home_allow_ro` list and mkcode's own installation are bound back
                     read-only
  host root only     every non-world-readable file or folder of /etc, SYSTEM_SECRETS, and /var/log,
                     /var/backups, /var/spool, /var/mail, /boot are masked: a user namespace keeps
                     the host uid for permission checks, so root-only files would stay readable
  workspace roots    read-write binds
  protected paths    (tools/protected.py) inside anything bound: secrets masked (empty read-only
                     tmpfs or /dev/null), read-only entries (start-up files, configs that run code,
                     mkcode's installation, caches and interpreter) bound read-only; with the
                     workspace at or above $HOME also the PATH folders below $HOME and toolchains
  every .git         read-only, found by a full walk of each root, with the gitdir and commondir of
                     worktree `.git` files; committing is a step outside the sandbox
  .mkcode            read-only (mkcode's own project settings)
  mkcode's private   (the seccomp filter file) masked if a workspace contains it
Namespaces: user (mapped to a non-root uid/gid; no capabilities; no nested user namespaces), PID,
network (loopback only), IPC, UTS, cgroup; --die-with-parent and --new-session. bubblewrap also
installs the seccomp filter of seccomp.py, and the command starts under landlock.py's launcher
where the kernel offers Landlock. Inside, git trusts every repository (safe.directory=*).

Protected entries that are absent inside a writable root, symlinks there, and symlinked folders
above them cannot be pinned by a mount without creating them on the host, so the plan records
them: `SandboxCommand.restore_guarded()` waits until the sandbox's PID namespace is gone, then
moves away whatever the command put there and puts symlinks back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from mkcode.tools.protected import SYSTEM_SECRETS, Protection, installation_paths, protected_paths
from mkcode.tools.sandbox import landlock, scratch, seccomp

# The uid/gid a command runs as inside the sandbox when mkcode runs as root.
SANDBOX_ID_FOR_ROOT = 1000

# Toolchains that live under $HOME, bound back read-only when present.
HOME_TOOLCHAINS = (
    ".pyenv",
    ".rbenv",
    ".nodenv",
    ".goenv",
    ".jenv",
    ".asdf",
    ".cargo",
    ".rustup",
    ".nvm",
    ".volta",
    ".bun",
    ".deno",
    "go",
    ".sdkman",
    ".ghcup",
    ".opam",
    ".elan",
    ".juliaup",
    ".conda",
    "miniconda3",
    "anaconda3",
    "miniforge3",
    ".local/bin",
    ".local/share/uv",
    ".local/share/mise",
    ".local/share/fnm",
    ".local/share/pnpm",
)

# Read-only views of the new procfs (bound from the host's, which holds the same kernel state).
PROC_READONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
# Masked in the new procfs: kernel memory and addresses, keyrings, timers, hardware details.
PROC_MASKED = (
    "/proc/kcore",
    "/proc/kmsg",
    "/proc/kallsyms",
    "/proc/keys",
    "/proc/key-users",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/kpagecount",
    "/proc/kpageflags",
    "/proc/kpagecgroup",
    "/proc/config.gz",
    "/proc/vmallocinfo",
    "/proc/acpi",
    "/proc/scsi",
    "/proc/asound",
)
SYS_MASKED = (
    "/sys/firmware",
    "/sys/kernel/debug",
    "/sys/kernel/tracing",
    "/sys/kernel/security",
    "/sys/fs/bpf",
)
# Scanned when the host uid is 0: non-world-readable entries below are masked.
ROOT_SCANNED = ("/etc",)
# Hidden as a whole when the host uid is 0 (root-only logs, backups, mail, kernel images).
ROOT_HIDDEN = ("/var/log", "/var/backups", "/var/spool", "/var/mail", "/boot")
# Pseudo file systems the .git walk never enters (a workspace of "/" would otherwise walk them).
_WALK_SKIP = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class BwrapFeatures:
    disable_userns: bool


@lru_cache(maxsize=8)
def bwrap_features(bwrap: str) -> BwrapFeatures:
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    return BwrapFeatures(disable_userns="--disable-userns" in text)


def sandbox_ids() -> tuple[int, int]:
    """(uid, gid) inside the sandbox: the caller's, or SANDBOX_ID_FOR_ROOT in place of 0."""
    uid, gid = os.getuid(), os.getgid()
    return (uid or SANDBOX_ID_FOR_ROOT, gid or SANDBOX_ID_FOR_ROOT)


def namespace_args(features: BwrapFeatures) -> list[str]:
    uid, gid = sandbox_ids()
    args = [
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "mkcode-sandbox",
        "--cap-drop",
        "ALL",
    ]
    if features.disable_userns:
        args.append("--disable-userns")
    return args


@dataclass
class MountPlan:
    args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (path, symlink target or None for "absent"): protected paths a mount cannot pin
    guarded: list[tuple[str, str | None]] = field(default_factory=list)
    # writable beneath these (workspace roots, the private home): Landlock's allow list
    writable: list[str] = field(default_factory=list)
    # folders inside writable roots made read-only or masked whole: nothing can be planted there
    pinned: list[str] = field(default_factory=list)

    def ro(self, path: str) -> None:
        self.args += ["--ro-bind", path, path]

    def rw(self, path: str) -> None:
        self.args += ["--bind", path, path]

    def mask(self, path: str) -> None:
        """Hide `path`: an empty read-only tmpfs for a folder, /dev/null for anything else."""
        if os.path.isdir(path):
            self.args += ["--tmpfs", path, "--remount-ro", path]
        else:
            self.args += ["--ro-bind", "/dev/null", path]


def _under(path: str, top: str) -> bool:
    return top == "/" or path == top or path.startswith(top.rstrip("/") + "/")


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(_under(path, r) for r in roots)


def _home(env: Mapping[str, str]) -> str | None:
    home = env.get("HOME") or os.path.expanduser("~")
    home = os.path.realpath(home) if home else ""
    return home if home not in ("", "/") and os.path.isdir(home) else None


def _real_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


@dataclass(frozen=True)
class _ScannedDir:
    key: tuple[int, int, int]  # st_dev, st_ino, st_ctime_ns of the folder when it was listed
    subdirs: tuple[str, ...]
    git: str | None


# Folder listings of earlier walks. A folder's ctime changes whenever an entry is created, removed
# or renamed in it, and no unprivileged process can set a ctime: a listing whose folder still has
# the same (device, inode, ctime) is still right. Folders changed in the last
# _FRESH_NS are listed again regardless (ctime granularity is a clock tick).
_scan_cache: dict[str, _ScannedDir] = {}
_SCAN_CACHE_MAX = 500_000
_FRESH_NS = 2_000_000_000


def find_git_entries(root: str, skip: frozenset[str] = frozenset()) -> list[str]:
    """Every `.git` (folder, file or symlink) at or below `root`: a full walk, no depth limit,
    symlinked folders not followed, nothing below a `.git` entered, nor below a folder in `skip`
    (mounted read-only or masked whole, e.g. a .venv: read-only already, nothing can be planted
    there). Unchanged folders are not listed again (one lstat each, see _scan_cache)."""
    if len(_scan_cache) > _SCAN_CACHE_MAX:
        _scan_cache.clear()
    found: list[str] = []
    stack = [root]
    now = time.time_ns()
    while stack:
        directory = stack.pop()
        if directory in skip:
            continue
        try:
            st = os.lstat(directory)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino, st.st_ctime_ns)
        scanned = _scan_cache.get(directory)
        if scanned is None or scanned.key != key or now - st.st_ctime_ns < _FRESH_NS:
            scanned = _list_dir(directory, key)
            _scan_cache[directory] = scanned
        if scanned.git is not None:
            found.append(scanned.git)
        stack.extend(scanned.subdirs)
    return sorted(found)


def _list_dir(directory: str, key: tuple[int, int, int]) -> _ScannedDir:
    subdirs: list[str] = []
    git: str | None = None
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name == ".git":
                    git = entry.path
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False) and entry.path not in _WALK_SKIP:
                        subdirs.append(entry.path)
                except OSError:
                    continue
    except OSError:
        pass
    return _ScannedDir(key, tuple(subdirs), git)


def root_only_entries(tops: Sequence[str] = ROOT_SCANNED) -> list[str]:
    """Files and folders below `tops` that others cannot read (folders: read or search): what a
    sandboxed command running with the host's uid 0 could otherwise read by owner bits."""
    found: list[str] = []
    stack = [t for t in tops if _real_dir(t)]
    while stack:
        directory = stack.pop()
        try:
            it = os.scandir(directory)
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if st.st_mode & 0o005 != 0o005:
                        found.append(entry.path)
                    else:
                        stack.append(entry.path)
                elif stat.S_ISREG(st.st_mode) and not st.st_mode & 0o004:
                    found.append(entry.path)
    return sorted(found)


def _git_targets(entry: str, notes: list[str]) -> list[str]:
    """What to make read-only for one `.git`: the entry, and for a worktree/submodule `.git` file
    or a symlink its git dir and that dir's commondir."""
    targets = [entry]
    gitdir: str | None = None
    if os.path.islink(entry):
        gitdir = os.path.realpath(entry)
        notes.append(f"{entry} is a symlink to {gitdir}; its target is read-only")
        targets = []
    elif os.path.isfile(entry):
        try:
            with open(entry, encoding="utf-8", errors="replace") as f:
                line = f.readline().strip()
        except OSError:
            line = ""
        if line.startswith("gitdir:"):
            gitdir = os.path.realpath(os.path.join(os.path.dirname(entry), line[len("gitdir:") :].strip()))
    elif os.path.isdir(entry):
        gitdir = entry
    if gitdir and os.path.isdir(gitdir):
        if gitdir != entry:
            targets.append(gitdir)
        commondir_file = os.path.join(gitdir, "commondir")
        if os.path.isfile(commondir_file) and not os.path.islink(commondir_file):
            try:
                with open(commondir_file, encoding="utf-8", errors="replace") as f:
                    common = os.path.realpath(os.path.join(gitdir, f.readline().strip()))
            except OSError:
                common = ""
            if common and os.path.isdir(common):
                targets.append(common)
    return targets


def _proc_and_sys(plan: MountPlan, host_root: bool) -> None:
    for p in PROC_READONLY:
        if os.path.lexists(p):
            plan.ro(p)
    for p in (*PROC_MASKED, *SYS_MASKED):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or (not host_root and not st.st_mode & 0o004):
            continue  # a non-root uid cannot read it anyway: one mount less per command
        plan.mask(p)


def _hidden_areas(home: str | None) -> list[str]:
    areas = ["/tmp"]
    if _real_dir("/run"):
        areas.append("/run")
    for h in ("/root", "/home"):
        if _real_dir(h):
            areas.append(h)
    if home and home not in areas:  # its own tmpfs: it must exist inside, even below a hidden area
        areas.append(home)
    return areas


def _allowed_home_dirs(home: str | None, home_allow_ro: Sequence[str]) -> list[str]:
    found: list[str] = []
    if home:
        found += [os.path.join(home, rel) for rel in HOME_TOOLCHAINS]
    for p in home_allow_ro:
        if p == "~" or p.startswith("~/"):
            p = p[2:]  # relative to the sandbox's $HOME (the command's environment)
        found.append(p if os.path.isabs(p) else os.path.join(home or "/", p))
    return [os.path.realpath(p) for p in found if os.path.exists(p)]


def _home_command_dirs(home: str, env: Mapping[str, str]) -> list[str]:
    """PATH entries below $HOME (present or not) and the toolchains' folders that exist: what
    the host's shell runs commands from."""
    found = [p for p in (os.path.join(home, rel) for rel in HOME_TOOLCHAINS) if os.path.lexists(p)]
    for entry in env.get("PATH", "").split(":"):
        if os.path.isabs(entry) and _under(os.path.normpath(entry), home) and os.path.normpath(entry) != home:
            found.append(os.path.normpath(entry))
    return list(dict.fromkeys(found))


def mount_plan(
    roots: Sequence[str],
    bwrap: str | None = None,
    *,
    home_allow_ro: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> MountPlan:
    env = os.environ if env is None else env
    plan = MountPlan()
    host_root = os.geteuid() == 0
    home = _home(env)
    prot = protected_paths(env)
    roots = [os.path.realpath(r) for r in roots]

    plan.args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    _proc_and_sys(plan, host_root)
    hidden = _hidden_areas(home)
    for area in hidden:
        plan.args += ["--tmpfs", area]
    if home and home in hidden:
        plan.writable.append(home)
    if host_root:
        for p in ROOT_HIDDEN:
            if _real_dir(p):
                plan.mask(p)
        masked: list[str] = []
        for p in dict.fromkeys((*root_only_entries(), *SYSTEM_SECRETS)):
            if os.path.lexists(p) and not os.path.islink(p) and not _inside(p, [*hidden, *masked]):
                plan.mask(p)
                masked.append(p)

    # Read-only views back into the hidden areas: toolchains, the user's list, mkcode itself.
    bound_ro: list[str] = []
    install = installation_paths()
    for p in [*_allowed_home_dirs(home, home_allow_ro), *install]:
        if not _inside(p, hidden) or _inside(p, bound_ro) or _inside(p, roots):
            continue
        if p not in install and prot.classify(p) is Protection.SECRET:
            plan.notes.append(f"{p} holds secrets (tools/protected.py); not made visible in the sandbox")
            continue
        plan.ro(p)
        bound_ro.append(p)

    writable_roots: list[str] = []
    for root in roots:
        kind = prot.classify(root)
        if kind is None:
            plan.rw(root)
            writable_roots.append(root)
        elif kind is Protection.READONLY:
            plan.ro(root)
            plan.notes.append(f"workspace root {root} is protected (tools/protected.py): read-only")
        else:
            plan.mask(root)
            plan.notes.append(f"workspace root {root} holds secrets (tools/protected.py): hidden")
    plan.writable += writable_roots

    # Protected paths inside anything bound above: secrets masked, the rest read-only.
    bound = [*writable_roots, *bound_ro]
    for p in prot.secret:
        if p in SYSTEM_SECRETS or not (_inside(p, bound) or not _inside(p, hidden)):
            continue
        _protect(plan, p, secret=True, writable=writable_roots)
    for p in prot.readonly:
        if _inside(p, writable_roots):
            _protect(plan, p, secret=False, writable=writable_roots)
    # With the workspace at (or above) $HOME, the folders the host's shell runs commands from
    # (PATH entries below $HOME, toolchains' bin folders) are read-only too, or guarded if absent.
    home_roots = [r for r in writable_roots if home and _under(home, r)]
    if home_roots:
        for p in _home_command_dirs(home, env):
            if _inside(p, home_roots):
                _protect(plan, p, secret=False, writable=writable_roots)

    for root in writable_roots:
        mk = os.path.join(root, ".mkcode")
        if _real_dir(mk):
            plan.ro(mk)
            plan.pinned.append(mk)
        elif os.path.islink(mk) or not os.path.lexists(mk):  # cannot be pinned: guarded instead
            plan.guarded.append((mk, os.readlink(mk) if os.path.islink(mk) else None))
        for entry in find_git_entries(root, skip=frozenset(plan.pinned)):
            for target in _git_targets(entry, plan.notes):
                if (
                    _inside(target, writable_roots)
                    and not os.path.islink(target)
                    and reachable_inside(target)
                ):
                    plan.ro(target)
            if os.path.islink(entry):
                plan.guarded.append((entry, os.readlink(entry)))
    if bwrap is not None and _inside(bwrap, writable_roots):
        plan.ro(bwrap)
    private = scratch.path()  # the filter the next command loads: never reachable inside
    if _inside(private, writable_roots):
        plan.mask(private)
    return plan


def reachable_inside(path: str) -> bool:
    """Can the sandboxed command reach `path` at all (search every folder above it)?

    As host root it keeps uid 0 for permission checks but has no capability over files of other
    owners (their uids are not mapped in its namespace): only owner bits of root's folders, group
    bits of gid 0's and the others' bits apply. bubblewrap itself cannot mount what its sandbox
    cannot reach (it fails), and what cannot be reached needs no protection. A non-root caller's
    own check is the same as the sandbox's."""
    if os.geteuid() != 0:
        return os.access(os.path.dirname(path) or "/", os.X_OK)
    d = os.path.dirname(path)
    while True:
        try:
            st = os.stat(d)
        except OSError:
            return False
        ok = (
            (st.st_uid == 0 and st.st_mode & 0o100)
            or (st.st_gid == 0 and st.st_mode & 0o010)
            or st.st_mode & 0o001
        )
        if not ok:
            return False
        if d == "/":
            return True
        d = os.path.dirname(d)


def _symlinked_ancestors(path: str, roots: Sequence[str]) -> list[str]:
    """Symlinks among `path`'s folders below the writable root holding it: re-pointing one
    would swap what `path` names on the host, so each is guarded."""
    root = max((r for r in roots if _under(path, r)), key=len, default=None)
    if root is None:
        return []
    found: list[str] = []
    current = root
    for part in os.path.relpath(os.path.dirname(path), root).split(os.sep):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            found.append(current)
    return found


def _protect(plan: MountPlan, path: str, *, secret: bool, writable: Sequence[str]) -> None:
    if not reachable_inside(path):
        return
    in_writable = _inside(path, writable)
    if in_writable:
        for link in _symlinked_ancestors(path, writable):
            if not any(g[0] == link for g in plan.guarded):
                plan.guarded.append((link, os.readlink(link)))
    if os.path.islink(path):
        target = os.path.realpath(path)
        if in_writable:
            plan.guarded.append((path, os.readlink(path)))
        if os.path.islink(target):  # a loop: nothing to read or write through it
            return
        if os.path.exists(target) and (secret or _inside(target, writable)):
            _protect(plan, target, secret=secret, writable=writable)
        return
    if not os.path.lexists(path):
        if in_writable:
            plan.guarded.append((path, None))
        return
    if secret:
        plan.mask(path)
    elif in_writable:
        plan.ro(path)
    else:
        return
    if in_writable and os.path.isdir(path):
        plan.pinned.append(path)


def restore_guarded(guarded: Sequence[tuple[str, str | None]]) -> list[str]:
    """After the command: move away anything it put at a guarded path (a protected path that was
    absent, or a symlink it re-pointed), and put the symlink back. Returns notes."""
    notes: list[str] = []
    for path, link in guarded:
        try:
            now: str | None = os.readlink(path) if os.path.islink(path) else None
            exists = os.path.lexists(path)
        except OSError:
            continue
        if (link is None and not exists) or (link is not None and now == link):
            continue
        if exists:
            aside = f"{path}.mkcode-quarantine-{int(time.time())}"
            try:
                os.rename(path, aside)
            except OSError as e:
                notes.append(
                    f"the command created protected path {path}; could not move it away: {e.strerror}"
                )
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                continue
            notes.append(f"the command created protected path {path}; moved to {aside}")
        if link is not None:
            try:
                os.symlink(link, path)
            except OSError as e:
                notes.append(f"could not restore symlink {path} -> {link}: {e.strerror}")
    return notes


@dataclass(frozen=True)
class SandboxCommand:
    argv: list[str]
    notes: list[str]
    guarded: list[tuple[str, str | None]]
    landlock_abi: int
    info_path: str | None = None  # bwrap --info-fd output: the host pid of the sandbox's init

    def wait_until_gone(self, timeout_s: float = 2.0) -> bool:
        """Wait for the sandbox's init to exit: the kernel kills and reaps every process of its
        PID namespace before that, so nothing of the command can still write afterwards."""
        pid = _info_child_pid(self.info_path)
        if pid is None:
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                return True
            if state in (b"Z", b"X"):
                return True
            time.sleep(0.005)
        return False

    def restore_guarded(self) -> list[str]:
        """After the command: wait for its sandbox to be gone, then undo what it planted at
        guarded paths (see the module docstring)."""
        notes: list[str] = []
        if not self.wait_until_gone():
            notes.append("the sandbox's processes were still running 2 s after the command ended")
        if self.info_path:
            with contextlib.suppress(OSError):
                os.unlink(self.info_path)
        return notes + restore_guarded(self.guarded)


def _info_child_pid(path: str | None) -> int | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.loads(f.read() or "{}").get("child-pid", 0)) or None
    except (OSError, ValueError, AttributeError):
        return None


@lru_cache(maxsize=1)
def host_landlock_abi() -> int:
    try:
        return landlock.landlock_abi()
    except (OSError, AttributeError):
        return 0


def build_command(
    bwrap: str,
    roots: Sequence[str],
    cwd: str,
    inner: Sequence[str],
    *,
    home_allow_ro: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    track: bool = True,
) -> SandboxCommand:
    """The full command line (filter on fd 3, bwrap ..., launcher, inner) and its mount notes.
    With `track`, bwrap reports its init's pid for restore_guarded() (call it after the run).
    Raises seccomp.UnsupportedArchitecture where no filter exists for this machine."""
    plan = mount_plan(roots, bwrap, home_allow_ro=home_allow_ro, env=env)
    abi = host_landlock_abi()
    command = list(inner)
    if abi >= 1:
        command = landlock.launcher_argv(os.path.realpath(sys.executable), plan.writable, command)
    info_path = os.path.join(scratch.path(), f"info-{uuid.uuid4().hex}.json") if track else os.devnull
    env = os.environ if env is None else env
    git_env: list[str] = []
    if "GIT_CONFIG_COUNT" not in env:
        # Inside, every repository is trusted: the uid map shows files of unmapped owners as
        # "nobody", and git would refuse them as of dubious ownership; what a repository's config
        # runs, it runs in the sandbox.
        git_env = ["--setenv", "GIT_CONFIG_COUNT", "1", "--setenv", "GIT_CONFIG_KEY_0", "safe.directory"]
        git_env += ["--setenv", "GIT_CONFIG_VALUE_0", "*"]
    argv = [
        bwrap,
        *namespace_args(bwrap_features(bwrap)),
        *git_env,
        "--seccomp",
        "3",
        "--info-fd",
        "4",
        *plan.args,
        "--chdir",
        cwd,
        "--",
        *command,
    ]
    # The filter on fd 3 and the info file on fd 4, opened by a shell that then becomes bwrap.
    wrapped = ["/bin/sh", "-c", 'f=$0 i=$1; shift; exec "$@" 3<"$f" 4>"$i"', seccomp.filter_file(), info_path]
    return SandboxCommand([*wrapped, *argv], plan.notes, plan.guarded, abi, info_path if track else None)


def build_argv(
    bwrap: str, roots: Sequence[str], cwd: str, inner: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Full argv and notes about protections that were adjusted (see build_command)."""
    cmd = build_command(bwrap, roots, cwd, inner, track=False)
    return cmd.argv, cmd.notes
