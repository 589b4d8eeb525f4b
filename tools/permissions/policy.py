"""The permission policy: given a call, allow it outright or ask the user."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mkcode.tools.permissions.modes import PermissionMode
from mkcode.tools.permissions.rules import AllowRule
from mkcode.tools.spec import ToolKind


@dataclass(frozen=True)
class Verdict:
    allowed: bool  # False means: ask
    by: str  # what decided ("mode:full-auto", "rule:...") or why it must ask


@dataclass
class PermissionPolicy:
    mode: PermissionMode = PermissionMode.ASK
    rules: list[AllowRule] = field(default_factory=list)

    def check(self, tool: str, kind: ToolKind, args: dict[str, Any], *, unsandboxed: bool = False) -> Verdict:
        if unsandboxed:
            # Leaving the sandbox is its own decision every time: no mode or rule covers it.
            return Verdict(False, "the command would run outside the sandbox")
        if kind is ToolKind.READ:
            return Verdict(True, "read-only tool")
        for rule in self.rules:
            if rule.matches(tool, args):
                return Verdict(True, f"rule:{rule.describe()}")
        if kind is ToolKind.EDIT and self.mode in (PermissionMode.AUTO_EDIT, PermissionMode.FULL_AUTO):
            return Verdict(True, f"mode:{self.mode.value}")
        if kind is ToolKind.SHELL and self.mode is PermissionMode.FULL_AUTO:
            return Verdict(True, f"mode:{self.mode.value}")
        what = "file edits" if kind is ToolKind.EDIT else "shell commands"
        return Verdict(False, f"{what} need approval in mode {self.mode.value}")

    def remember(self, rule: AllowRule) -> None:
        if rule not in self.rules:
            self.rules.append(rule)
