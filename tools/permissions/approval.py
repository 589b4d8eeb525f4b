"""Approval requests (what the UI shows) and the user's answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from mkcode.tools.permissions.rules import AllowRule


class Decision(Enum):
    ALLOW_ONCE = "allow_once"
    ALLOW_ALWAYS = "allow_always"  # adds `rule` (or the suggested one) to the policy
    DENY = "deny"


@dataclass(frozen=True)
class ApprovalRequest:
    """One question for the user. `preview` is the diff an edit would make, or the command."""

    tool: str
    args: dict[str, Any]
    kind: str  # "read" | "edit" | "shell"
    preview: str
    reason: str  # why this needs approval
    unsandboxed: bool = False  # running it leaves the sandbox: never remembered as 'always'
    suggested_rule: AllowRule | None = None  # what ALLOW_ALWAYS would remember


@dataclass(frozen=True)
class ApprovalResponse:
    decision: Decision
    rule: AllowRule | None = None  # overrides the suggested rule for ALLOW_ALWAYS
    message: str = ""  # optional note for the model on DENY ("use pytest -x instead")


Approver = Callable[[ApprovalRequest], "ApprovalResponse | Decision"]
