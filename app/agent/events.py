"""Events the agent streams to its user (TUI, line REPL, print mode, JSON output).

One `Agent.run(prompt)` yields these in order: text/reasoning deltas while the model writes,
`ToolCallStarted`/`ToolCallFinished` around every tool call (with `ApprovalRequested` in between when
the permission policy asks the user), `Notice`s for things the user should know (malformed model
output, truncated tool output, compaction), and exactly one `TurnFinished` at the end. Every event is
a frozen dataclass with a `type` tag, and `to_dict()` gives a JSON-ready form (stream-json output).
`TextDelta`, `ReasoningDelta` and `Usage` are the turn pipeline's own (`mkcode.backend.turn.events`,
`mkcode.backend.usage`), re-exported here: the model's text reaches the user as the same objects.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from mkcode.backend.turn.events import Event as _Event
from mkcode.backend.turn.events import ReasoningDelta, TextDelta
from mkcode.backend.usage import Usage
from mkcode.tools import ApprovalRequest, ApprovalResponse, Decision

__all__ = [
    "AgentError",
    "AgentEvent",
    "ApprovalRequested",
    "FinishReason",
    "Notice",
    "NoticeKind",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "TurnFinished",
    "Usage",
]


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
