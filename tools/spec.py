"""What a tool is: a name, a model-facing description, a JSON schema, a kind, and prepare()."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from mkcode.tools.result import ToolResult
from mkcode.tools.sandbox.runner import SandboxSettings
from mkcode.tools.workspace import Workspace


class ToolKind(Enum):
    """What the permission policy keys on."""

    READ = "read"  # no side effects
    EDIT = "edit"  # writes files in the workspace
    SHELL = "shell"  # runs a command


@dataclass(frozen=True)
class ToolSpec:
    """The schema the model sees for one tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: ToolKind

    def to_openai(self) -> dict[str, Any]:
        """OpenAI-style `tools` entry (also what chat templates expect)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolContext:
    workspace: Workspace
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    cancel: threading.Event | None = None  # set by the UI to interrupt a running shell command


@dataclass
class Prepared:
    """A validated call, ready to run once permitted.

    `preview` is what an approval dialog shows (a diff, the command). `unsandboxed_reason` is set
    when running would leave the sandbox; that always needs its own explicit approval.
    """

    preview: str
    run: Callable[[], ToolResult]
    unsandboxed_reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class Tool(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    kind: ClassVar[ToolKind]

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters, self.kind)

    @abstractmethod
    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        """Check the (schema-valid) args and plan the call; a ToolResult here is an early error."""


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
