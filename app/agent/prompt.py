"""The system prompt: how to work, the environment (cwd, OS, date, git status) and AGENTS.md.

The git status comes from tools/hostgit.py: git runs inside the sandbox (a repository's config can
name programs git would run), or not at all.
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Sequence
from pathlib import Path

from mkcode.tools.hostgit import GitInfo, workspace_git_info
from mkcode.tools.sandbox.runner import SandboxSettings

DEFAULT_INSTRUCTIONS = """\
You are mkcode, a coding assistant working in the user's project through tools.
- Look before you change: list, glob, grep and read the relevant files first.
- Edit with edit_file (exact, unique text replacement) or write_file; keep changes minimal and in the
  project's style. Run the tests or the program with run_shell to check your work.
- Call tools whenever you need information; several independent reads may be called at once.
- When the task is done, answer briefly: what you found or changed, and anything left to do.
- If a tool call is denied, do not retry it unchanged: adapt, or ask the user."""

MAX_AGENTS_MD_CHARS = 20_000


def git_info(
    cwd: str | Path, roots: Sequence[str] | None = None, sandbox: SandboxSettings | None = None
) -> GitInfo | None:
    """The repository's status for the prompt; git runs inside the sandbox, never on the host."""
    return workspace_git_info(str(cwd), roots, sandbox)


def find_agents_md(cwd: str | Path) -> list[Path]:
    """AGENTS.md files from the repository root (or the filesystem root) down to `cwd`, outermost
    first, so that the most specific instructions come last."""
    here = Path(cwd).resolve()
    chain = [here, *here.parents]
    found: list[Path] = []
    for d in chain:
        f = d / "AGENTS.md"
        if f.is_file():
            found.append(f)
        if (d / ".git").exists():
            break
    return list(reversed(found))


def agents_md_text(cwd: str | Path) -> str | None:
    parts = []
    for f in find_agents_md(cwd):
        try:
            text = f.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if text:
            parts.append(f"## {f}\n{text}")
    if not parts:
        return None
    text = "\n\n".join(parts)
    if len(text) > MAX_AGENTS_MD_CHARS:
        text = text[:MAX_AGENTS_MD_CHARS] + "\n[AGENTS.md shortened]"
    return text


def build_system_prompt(
    cwd: str | Path,
    *,
    instructions: str | None = None,
    include_agents_md: bool = True,
    today: _dt.date | None = None,
    roots: Sequence[str] | None = None,
    sandbox: SandboxSettings | None = None,
) -> str:
    today = today or _dt.date.today()
    env = [
        f"Working directory: {Path(cwd).resolve()}",
        f"Platform: {platform.system()} {platform.release()}",
        f"Date: {today.isoformat()}",
    ]
    info = git_info(cwd, roots, sandbox)
    env.append("Git repository: no" if info is None else info.describe())
    sections = [instructions or DEFAULT_INSTRUCTIONS, "# Environment\n" + "\n".join(env)]
    if include_agents_md:
        memo = agents_md_text(cwd)
        if memo:
            sections.append("# Project instructions (AGENTS.md)\n" + memo)
    return "\n\n".join(sections)
