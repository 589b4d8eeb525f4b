"""The events of one model turn: what the cmd4 parser, the turn pipeline, the server's endpoints
and the agent's clients all speak.

A turn streams `TextDelta` / `ReasoningDelta` while the model writes, `ToolCallBegin` →
`ToolCallArgsDelta`… → `ToolCallReady` for every tool call (`ToolCallReady` is authoritative: its
`arguments` are a JSON object serialised with `json.dumps`; the begin/delta events are the early,
best-effort stream for OpenAI-style clients), `MalformedOutput` where the output cannot be read as a
call (the message is written for the model), and exactly one `ModelDone` at the end.

Every event is a frozen dataclass with a `type` tag and `to_dict()` (the agent's stream-json output
uses the same form). No torch here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from mkcode.backend.usage import Usage

__all__ = [
    "Event",
    "MalformedOutput",
    "ModelDone",
    "ModelEvent",
    "ModelFinishReason",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallArgsDelta",
    "ToolCallBegin",
    "ToolCallReady",
    "Usage",
]


class Event:
    """Base of the typed events: a `type` tag and a JSON-ready `to_dict()`."""

    type: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name.startswith("_"):
                continue
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
        return out


@dataclass(frozen=True)
class TextDelta(Event):
    """More of the assistant's answer text."""

    type: ClassVar[str] = "text_delta"
    text: str


@dataclass(frozen=True)
class ReasoningDelta(Event):
    """More of the assistant's reasoning ("thinking") text."""

    type: ClassVar[str] = "reasoning_delta"
    text: str


@dataclass(frozen=True)
class ToolCallBegin(Event):
    """A tool call starts streaming; `index` counts the calls of this turn from 0."""

    type: ClassVar[str] = "tool_call_begin"
    index: int
    call_id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgsDelta(Event):
    """More of the JSON arguments of call `index` (best effort; `ToolCallReady` is authoritative)."""

    type: ClassVar[str] = "tool_call_args_delta"
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallReady(Event):
    """A complete, valid tool call; `arguments` is a JSON object serialised with `json.dumps`."""

    type: ClassVar[str] = "tool_call_ready"
    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class MalformedOutput(Event):
    """The model wrote something that is not a valid tool call; `message` is written for the model."""

    type: ClassVar[str] = "malformed_output"
    message: str


ModelFinishReason = Literal["stop", "tool_calls", "length", "cancelled", "error"]


@dataclass(frozen=True)
class ModelDone(Event):
    """The turn is over: `finish_reason` is `tool_calls` when it completed at least one call."""

    type: ClassVar[str] = "model_done"
    finish_reason: ModelFinishReason
    usage: Usage
    error: str | None = None


ModelEvent = (
    TextDelta
    | ReasoningDelta
    | ToolCallBegin
    | ToolCallArgsDelta
    | ToolCallReady
    | MalformedOutput
    | ModelDone
)
