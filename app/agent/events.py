"""Events the agent streams to its user (TUI, line REPL, print mode, JSON output).

One `Agent.run(prompt)` yields these in order: text/reasoning deltas while the model writes,
`ToolCallStarted`/`ToolCallFinished` around every tool call (with `ApprovalRequested` in between when
the permission policy asks the user), `Notice`s for things the user should know (malformed model
output, truncated tool output, compaction), and exactly one `TurnFinished` at the end. Every event is
a frozen dataclass with a `type` tag, and `to_dict()` gives a JSON-ready form (stream-json output).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from mkcode.tools import ApprovalRequest, ApprovalResponse, Decision


@dataclass
class Usage:
    """Token counts: per model call, or summed over a turn or a session."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from a prefix cache, when the backend says

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "total_tokens": self.total_tokens,
        }


class _Event:
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
class TextDelta(_Event):
    """More of the assistant's answer text."""

    type: ClassVar[str] = "text_delta"
    text: str


@dataclass(frozen=True)
class ReasoningDelta(_Event):
    """More of the assistant's reasoning ("thinking") text."""

    type: ClassVar[str] = "reasoning_delta"
    text: str


@dataclass(frozen=True)
class ToolCallStarted(_Event):
    """The model asked for a tool call; it is about to be checked and run.

    `arguments` is the parsed JSON object (or the raw string when it did not parse)."""

    type: ClassVar[str] = "tool_call_started"
    call_id: str
    name: str
    arguments: dict[str, Any] | str


@dataclass(frozen=True)
class ToolCallFinished(_Event):
    """A tool call ended. `output` is exactly what the model sees (after truncation).

    `ok` False with `denied` True: the policy or the user refused it; `interrupted`: the user
    interrupted the turn before or while it ran. `diff` is the unified diff of an edit/write."""

    type: ClassVar[str] = "tool_call_finished"
    call_id: str
    name: str
    ok: bool
    output: str
    error: str | None = None
    denied: bool = False
    interrupted: bool = False
    diff: str | None = None
    truncated: bool = False
    duration_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class ApprovalRequested(_Event):
    """The permission policy wants the user to decide on a tool call.

    Call `answer(...)` exactly once (from any thread): `Decision.ALLOW_ONCE`, `Decision.ALLOW_ALWAYS`,
    `Decision.DENY`, or an `ApprovalResponse` (with a rule or a note for the model). The tool call
    waits until then; `Agent.interrupt()` answers DENY for you."""

    type: ClassVar[str] = "approval_requested"
    call_id: str
    request: ApprovalRequest
    _future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future, repr=False)

    def answer(self, decision: Decision | ApprovalResponse, message: str = "") -> None:
        response = (
            decision
            if isinstance(decision, ApprovalResponse)
            else ApprovalResponse(decision, message=message)
        )
        if not self._future.done():  # answered concurrently: the first answer wins
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self._future.set_result(response)

    @property
    def answered(self) -> bool:
        return self._future.done()

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {
            "type": self.type,
            "call_id": self.call_id,
            "tool": r.tool,
            "args": r.args,
            "kind": r.kind,
            "preview": r.preview,
            "reason": r.reason,
            "unsandboxed": r.unsandboxed,
        }


NoticeKind = Literal["malformed_output", "output_truncated", "compacted", "step_limit", "info"]


@dataclass(frozen=True)
class Notice(_Event):
    """Something worth showing that is not model text: malformed tool-call output (the model is told
    and the loop goes on), a tool output cut to fit, history compacted, the step limit reached."""

    type: ClassVar[str] = "notice"
    kind: NoticeKind
    message: str


FinishReason = Literal["done", "step_limit", "interrupted", "error"]


@dataclass(frozen=True)
class TurnFinished(_Event):
    """The turn is over. `usage` sums every model call of the turn; `context_tokens` is the size of
    the conversation now (what the next call's prompt will be, approximately) out of
    `context_window`."""

    type: ClassVar[str] = "turn_finished"
    reason: FinishReason
    usage: Usage
    steps: int
    context_tokens: int
    context_window: int
    error: str | None = None


@dataclass(frozen=True)
class AgentError(_Event):
    """The model backend failed (connection refused, HTTP error, engine error). The turn then ends
    with `TurnFinished(reason="error")`; the history stays consistent."""

    type: ClassVar[str] = "error"
    message: str


AgentEvent = (
    TextDelta
    | ReasoningDelta
    | ToolCallStarted
    | ToolCallFinished
    | ApprovalRequested
    | Notice
    | TurnFinished
    | AgentError
)
