"""The workspace's git status for the system prompt, without running the repository's config on the host.

A repository's config can name programs that git runs: core.fsmonitor, filter.<x>.clean/smudge/
process (with .gitattributes), diff.external, textconv, core.pager, core.sshCommand, credential
helpers, gpg.program, aliases, include/includeIf paths to more config, and a `.git` file or
`commondir` can point git at config elsewhere. A sandboxed command can plant any of these (`git
init` in a workspace without .git, a submodule), so mkcode never runs git on the workspace on the
host:

- with the sandbox available, `git status` runs inside it (the same bubblewrap sandbox as a shell
  command): whatever the repository makes git run is contained like any sandboxed command. The
  command-running settings that `status` can reach are forced off too (fsmonitor, untracked cache,
  hooks), so a planted one cannot slow the prompt down, but containment is the guarantee;
- without the sandbox, no git runs at all: the branch is read from the HEAD file by plain Python
  (a file read, nothing executed) and the status is reported as not shown, with the reason.

Dulwich (pure-Python git) was not used: its status applies the repository's gitattributes filters,
which run the configured filter commands.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mkcode.tools.sandbox.runner import SandboxSettings, run_shell_command, sandbox_status

MAX_STATUS_LINES = 30
GIT_TIMEOUT_S = 3.0
_MAX_HEAD_BYTES = 512
_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
_REF = re.compile(r"ref: refs/heads/([^\x00-\x1f\x7f ~^:?*\[\\]{1,200})")

# Settings `git status` could otherwise take from the repository to run or spawn something.
GIT_SAFE_CONFIG = (
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "diff.external=",
    "protocol.allow=never",
    "color.status=false",
    "status.submoduleSummary=false",
    "safe.directory=*",  # the sandbox may map the owner to another uid; ownership is no defence here
)
# The host environment's GIT_* variables (GIT_DIR, GIT_CONFIG_*, GIT_EXEC_PATH...) are not passed.
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_GIT_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
}


@dataclass(frozen=True)
class GitInfo:
    """What the system prompt says about the workspace's repository."""

    status: str | None  # `git status --short --branch` (shortened), or None when not shown
    branch: str | None  # from HEAD when the status is not shown
    note: str | None  # why the status is not shown

    def describe(self) -> str:
        if self.status is not None:
            return f"Git status:\n{self.status}"
        branch = f"Git branch: {self.branch}" if self.branch else "Git repository: yes"
        return f"{branch} (status not shown: {self.note})" if self.note else branch


def git_command(extra: Sequence[str] = ()) -> list[str]:
    """`git status --short --branch` with the command-running settings forced off."""
    argv = ["git", "--no-optional-locks", "--no-pager"]
    for item in GIT_SAFE_CONFIG:
        argv += ["-c", item]
    return [*argv, "status", "--short", "--branch", *extra]


def _git_env(environ: Mapping[str, str]) -> dict[str, str]:
    env = {k: environ[k] for k in _ENV_KEEP if k in environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(_GIT_ENV)
    return env


def _shorten(text: str) -> str:
    lines = text.splitlines()
    if len(lines) > MAX_STATUS_LINES:
        more = len(lines) - MAX_STATUS_LINES
        lines = [*lines[:MAX_STATUS_LINES], f"... and {more} more changed files"]
    return "\n".join(lines) if lines else "(clean)"


def workspace_git_info(
    cwd: str,
    roots: Sequence[str] | None = None,
    settings: SandboxSettings | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = GIT_TIMEOUT_S,
) -> GitInfo | None:
    """The repository's status at `cwd` (None outside a repository), never running git on the host."""
    cwd = os.path.realpath(cwd)
    roots = tuple(roots) if roots else (cwd,)
    settings = settings or SandboxSettings()
    env = _git_env(os.environ if environ is None else environ)
    if sandbox_status(settings, roots).available:
        return _sandboxed_status(cwd, roots, settings, env, timeout_s)
    branch = read_branch(cwd)
    if branch is None:
        return None
    return GitInfo(None, branch, "the sandbox is unavailable, and mkcode runs no git command outside it")


def _sandboxed_status(
    cwd: str, roots: Sequence[str], settings: SandboxSettings, env: dict[str, str], timeout_s: float
) -> GitInfo | None:
    # stderr is dropped (it would be interleaved with the status); the exit code tells the story.
    command = " ".join(shlex.quote(a) for a in git_command()) + " 2>/dev/null"
    try:
        outcome = run_shell_command(
            command, roots=roots, cwd=cwd, timeout_s=timeout_s, settings=settings, sandboxed=True, environ=env
        ).process
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        branch = read_branch(cwd)
        return None if branch is None else GitInfo(None, branch, f"git could not run in the sandbox: {e}")
    if outcome.timed_out:
        branch = read_branch(cwd)
        return GitInfo(None, branch, f"git status took longer than {timeout_s:g} s")
    if outcome.exit_code != 0:
        return None  # not a repository (128), or no git (127)
    return GitInfo(_shorten(outcome.output), None, None)


# -- reading HEAD without git --------------------------------------------------------------------


def _read_small(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO or device planted as HEAD: never block on it
        return os.read(fd, _MAX_HEAD_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _git_dir(start: str) -> str | None:
    """The git directory for `start` (walking up), following a `gitdir:` file; nothing executed."""
    d = start
    while True:
        dot = os.path.join(d, ".git")
        if os.path.isdir(dot):
            return dot
        if os.path.isfile(dot):
            text = _read_small(dot) or ""
            first = text.split("\n", 1)[0].strip()
            if first.startswith("gitdir:"):
                target = first[len("gitdir:") :].strip()
                return os.path.normpath(os.path.join(d, target))
            return None
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def read_branch(cwd: str) -> str | None:
    """The checked-out branch (or 'detached at <sha>') from HEAD; None outside a repository."""
    gitdir = _git_dir(os.path.realpath(cwd))
    if gitdir is None:
        return None
    head = (_read_small(os.path.join(gitdir, "HEAD")) or "").strip()
    m = _REF.fullmatch(head)
    if m:
        return m.group(1)
    if _SHA.fullmatch(head):
        return f"detached at {head[:12]}"
    return "unknown (HEAD unreadable)"
