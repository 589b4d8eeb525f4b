"""The system prompt: how to work, the environment (cwd, OS, date, git status) and AGENTS.md."""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from pathlib import Path

DEFAULT_INSTRUCTIONS = """\
You are mkcode, a coding assistant working in the user's project through tools.
- Look before you change: list, glob, grep and read the relevant files first.
- Edit with edit_file (exact, unique text replacement) or write_file; keep changes minimal and in the
  project's style. Run the tests or the program with run_shell to check your work.
- Call tools whenever you need information; several independent reads may be called at once.
- When the task is done, answer briefly: what you found or changed, and anything left to do.
- If a tool call is denied, do not retry it unchanged: adapt, or ask the user."""

MAX_AGENTS_MD_CHARS = 20_000
MAX_GIT_STATUS_LINES = 30


def git_status(cwd: str | Path, timeout_s: float = 2.0) -> str | None:
    """`git status --short --branch`, shortened; None outside a repository or without git."""
    try:
        out = subprocess.run(
            ["git", "status", "--short", "--branch"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    lines = out.stdout.splitlines()
    if len(lines) > MAX_GIT_STATUS_LINES:
        more = len(lines) - MAX_GIT_STATUS_LINES
        lines = [*lines[:MAX_GIT_STATUS_LINES], f"... and {more} more changed files"]
    return "\n".join(lines) if lines else "(clean)"


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
) -> str:
    today = today or _dt.date.today()
    env = [
        f"Working directory: {Path(cwd).resolve()}",
        f"Platform: {platform.system()} {platform.release()}",
        f"Date: {today.isoformat()}",
    ]
    status = git_status(cwd)
    env.append("Git repository: no" if status is None else f"Git status:\n{status}")
    sections = [instructions or DEFAULT_INSTRUCTIONS, "# Environment\n" + "\n".join(env)]
    if include_agents_md:
        memo = agents_md_text(cwd)
        if memo:
            sections.append("# Project instructions (AGENTS.md)\n" + memo)
    return "\n\n".join(sections)
