"""The bubblewrap command line for one sandboxed command.

Layout inside the sandbox:
  /                read-only bind of the host root (recursive)
  /dev, /proc      fresh minimal devtmpfs and a procfs of the new PID namespace
  /tmp, /run       private tmpfs (the host's /tmp is invisible; /run hides docker.sock, dbus...)
  secrets in ~     ~/.ssh, ~/.aws, ... hidden behind empty tmpfs or /dev/null
  workspace roots  read-write binds
  .git             bound onto itself (a mount point cannot be renamed or deleted, so a fresh
                   .git cannot be planted), with hooks/ and config re-bound read-only: code there
                   would run outside the sandbox at the user's next git command
  .mkcode          read-only (mkcode's own project settings)
Namespaces: user (no capabilities, no nested user namespaces), PID, network (loopback only),
IPC, UTS, cgroup. --die-with-parent and --new-session (no TIOCSTI into the user's terminal).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# Files and directories under $HOME hidden from sandboxed commands (credentials).
HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".config/gcloud",
    ".config/gh",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
)
# How deep below each root to look for nested repositories (submodules, vendored repos).
GIT_SCAN_DEPTH = 2
_SKIP_SCAN = {"node_modules", ".venv", "venv", "__pycache__", ".tox", "target", "build", "dist"}


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


def namespace_args(features: BwrapFeatures) -> list[str]:
    args = [
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
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

    def ro(self, path: str) -> None:
        self.args += ["--ro-bind", path, path]

    def rw(self, path: str) -> None:
        self.args += ["--bind", path, path]


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _git_dirs(root: str) -> list[str]:
    """`.git` entries at the root and up to GIT_SCAN_DEPTH levels below it."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        depth = dirpath[len(root) :].count("/")
        if ".git" in dirnames or ".git" in filenames:
            found.append(os.path.join(dirpath, ".git"))
        dirnames[:] = [d for d in dirnames if d != ".git" and d not in _SKIP_SCAN and depth < GIT_SCAN_DEPTH]
    return found


def _protect_git_dir(plan: MountPlan, gitdir: str, roots: Sequence[str]) -> None:
    """Keep a repository usable (commits work) but make hooks/ and config read-only."""
    if not _inside(gitdir, roots):
        return  # outside the writable roots: already read-only
    hooks = os.path.join(gitdir, "hooks")
    config = os.path.join(gitdir, "config")
    if not os.path.lexists(hooks):
        try:
            os.mkdir(hooks, 0o755)  # git expects it anyway; it must exist to be mounted over
        except OSError as e:
            plan.notes.append(f"could not create {hooks} ({e.strerror}); {gitdir} mounted read-only")
            plan.ro(gitdir)
            return
    if os.path.islink(hooks) or os.path.islink(config):
        # A bind mount would land on the link target and the link itself could be re-pointed.
        plan.notes.append(f"{gitdir}/hooks or config is a symlink; {gitdir} mounted read-only")
        plan.ro(gitdir)
        return
    plan.rw(gitdir)
    plan.ro(hooks)
    if os.path.lexists(config):
        plan.ro(config)


def _protect_git_entry(plan: MountPlan, entry: str, roots: Sequence[str]) -> None:
    if os.path.islink(entry):
        target = os.path.realpath(entry)
        plan.notes.append(f"{entry} is a symlink to {target}; protecting the target")
        if os.path.isdir(target):
            _protect_git_dir(plan, target, roots)
        return
    if os.path.isdir(entry):
        _protect_git_dir(plan, entry, roots)
        return
    # A worktree or submodule: `.git` is a file "gitdir: PATH". Pin the file, protect the dirs.
    plan.ro(entry)
    try:
        line = Path(entry).read_text(encoding="utf-8", errors="replace").split("\n", 1)[0].strip()
    except OSError:
        return
    if not line.startswith("gitdir:"):
        return
    gitdir = os.path.realpath(os.path.join(os.path.dirname(entry), line[len("gitdir:") :].strip()))
    if not os.path.isdir(gitdir):
        return
    _protect_git_dir(plan, gitdir, roots)
    commondir_file = os.path.join(gitdir, "commondir")
    if os.path.isfile(commondir_file):
        common = Path(commondir_file).read_text(encoding="utf-8", errors="replace").strip()
        common = os.path.realpath(os.path.join(gitdir, common))
        if os.path.isdir(common):
            _protect_git_dir(plan, common, roots)


def mount_plan(roots: Sequence[str], bwrap: str | None = None) -> MountPlan:
    plan = MountPlan()
    plan.args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    if os.path.isdir("/run") and not os.path.islink("/run"):
        plan.args += ["--tmpfs", "/run"]
    home = os.path.expanduser("~")
    if home not in ("", "/") and os.path.isdir(home):
        for rel in HOME_SECRETS:
            p = os.path.join(home, rel)
            if not os.path.lexists(p) or _inside(p, roots) or os.path.islink(p):
                continue
            if os.path.isdir(p):
                plan.args += ["--tmpfs", p, "--remount-ro", p]
            else:
                plan.args += ["--ro-bind", "/dev/null", p]
    for root in roots:
        plan.rw(root)
    for root in roots:
        for entry in _git_dirs(root):
            _protect_git_entry(plan, entry, roots)
        mk = os.path.join(root, ".mkcode")
        if os.path.isdir(mk) and not os.path.islink(mk):
            plan.ro(mk)
    if bwrap is not None and _inside(bwrap, roots):
        plan.ro(bwrap)
    return plan


def build_argv(
    bwrap: str, roots: Sequence[str], cwd: str, inner: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Full argv (bwrap ... -- inner) and notes about protections that were adjusted."""
    plan = mount_plan(roots, bwrap)
    argv = [bwrap, *namespace_args(bwrap_features(bwrap)), *plan.args, "--chdir", cwd, "--", *inner]
    return argv, plan.notes
