"""'Always allow' rules: per tool, or per shell command prefix.

A shell prefix rule matches on words, not characters ('git status' does not match 'git statusx'),
and only for simple commands: anything with shell operators, substitutions or redirections
('git status; rm -rf ~', 'git log $(evil)') never matches a prefix rule and is asked again.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

SHELL_TOOL = "run_shell"
# Characters that make a command line more than one plain command.
_SHELL_SPECIAL = set("`$;&|<>(){}\n\r\\")
# Programs whose first argument is a subcommand worth keeping in a suggested rule.
_SUBCOMMAND_PROGRAMS = {
    "git", "npm", "pnpm", "yarn", "cargo", "go", "pip", "uv", "poetry", "docker", "kubectl",
    "make", "python", "python3", "pytest", "ruff", "dotnet", "gradle", "mvn", "bun", "deno",
}  # fmt: skip


def simple_command_words(command: str) -> list[str] | None:
    """The words of a plain command, or None if it uses any shell syntax beyond quoting."""
    if any(c in _SHELL_SPECIAL for c in command):
        return None
    try:
        words = shlex.split(command, posix=True)
    except ValueError:
        return None
    return words or None


@dataclass(frozen=True)
class AllowRule:
    tool: str
    command_prefix: tuple[str, ...] | None = None  # run_shell only; None = any command

    def matches(self, tool: str, args: dict[str, Any]) -> bool:
        if tool != self.tool:
            return False
        if self.command_prefix is None:
            return True
        words = simple_command_words(str(args.get("command", "")))
        return words is not None and tuple(words[: len(self.command_prefix)]) == self.command_prefix

    def describe(self) -> str:
        if self.command_prefix is None:
            return self.tool
        return f"{self.tool}({shlex.join(self.command_prefix)} *)"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool}
        if self.command_prefix is not None:
            out["command_prefix"] = list(self.command_prefix)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AllowRule:
        prefix = d.get("command_prefix")
        return cls(str(d["tool"]), tuple(str(w) for w in prefix) if prefix is not None else None)


def suggest_rule(tool: str, args: dict[str, Any]) -> AllowRule | None:
    """The rule 'always allow' would add for this call (None: cannot be generalised safely)."""
    if tool != SHELL_TOOL:
        return AllowRule(tool)
    words = simple_command_words(str(args.get("command", "")))
    if not words or "=" in words[0]:
        return None
    prefix = words[:1]
    if len(words) > 1 and words[0] in _SUBCOMMAND_PROGRAMS and not words[1].startswith("-"):
        prefix = words[:2]
    return AllowRule(tool, tuple(prefix))
