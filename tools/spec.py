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


# Bounds an argument gets when its tool's schema sets none, so every schema the model sees (and
# every call validated against it) has a finite range, length and size.
NAME_MAX_CHARS = 4096  # paths, globs, patterns: PATH_MAX
TEXT_MAX_CHARS = 10 * 1024 * 1024  # file content and replacement text (the edit tools' byte limit)
INTEGER_MAX = 2**31 - 1
NUMBER_MAX = 1e9
ARRAY_MAX_ITEMS = 1000
_NAME_ARGUMENTS = frozenset({"path", "glob", "pattern"})


def bounded(name: str, prop: dict[str, Any]) -> dict[str, Any]:
    """`prop` with a maxLength / minimum+maximum / maxItems added where it has none."""
    out = dict(prop)
    kind = out.get("type")
    if kind == "string" and "maxLength" not in out and "enum" not in out:
        out["maxLength"] = NAME_MAX_CHARS if name in _NAME_ARGUMENTS else TEXT_MAX_CHARS
    elif kind in ("integer", "number"):
        top = INTEGER_MAX if kind == "integer" else NUMBER_MAX
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = top
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -top
    elif kind == "array":
        out.setdefault("maxItems", ARRAY_MAX_ITEMS)
        if isinstance(out.get("items"), dict):
            out["items"] = bounded(name, out["items"])
    elif kind == "object" and isinstance(out.get("properties"), dict):
        out["properties"] = {k: bounded(k, v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A closed object schema (unknown arguments refused) whose every argument is bounded."""
    return {
        "type": "object",
        "properties": {name: bounded(name, prop) for name, prop in properties.items()},
        "required": required,
        "additionalProperties": False,
    }
