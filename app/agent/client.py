"""The agent's view of a model backend: `EngineClient`, the request it takes and the events it streams.

Two implementations: `InProcessClient` (mkcode.app.agent.inprocess: the local Engine, the checkpoint's
chat template and the cmd4 stream parser) and `OpenAICompatClient` (mkcode.app.agent.openai_compat: any
OpenAI-compatible `/v1/chat/completions`, streamed). Tests use a scripted double of the same interface.

Contract of `stream()`: an async iterator of `ModelEvent`s that ends with exactly one `ModelDone`
(backend failures included: `ModelDone(finish_reason="error", error=...)` rather than an exception).
Closing the iterator early (`aclose()`, or cancelling the task that reads it) cancels the generation.
Every tool call the model completes is reported once as `ToolCallReady` with JSON-object `arguments`;
output that cannot be read as a tool call becomes `MalformedOutput` with a message fit for the model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mkcode.backend.turn.events import (
    MalformedOutput,
    ModelDone,
    ModelEvent,
    ModelFinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)

__all__ = [
    "ChatRequest",
    "EngineClient",
    "MalformedOutput",
    "Message",
    "ModelDone",
    "ModelEvent",
    "ModelFinishReason",
    "ReasoningChunk",
    "ReasoningDelta",
    "TextChunk",
    "TextDelta",
    "ToolCallArgsDelta",
    "ToolCallBegin",
    "ToolCallReady",
    "ToolSchema",
    "estimate_tokens",
]

Message = dict[str, Any]  # OpenAI-shaped chat message (role, content, tool_calls, tool_call_id, ...)
ToolSchema = dict[str, Any]  # OpenAI-shaped tool: {"type": "function", "function": {...}}


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[ToolSchema] = field(default_factory=list)
    max_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


# The model stream's events are the turn pipeline's (one vocabulary for the server and the agent).
# TextChunk / ReasoningChunk are the names this module gave them before; kept for existing callers.
TextChunk = TextDelta
ReasoningChunk = ReasoningDelta


@runtime_checkable
class EngineClient(Protocol):
    """What the agent needs from a model backend."""

    @property
    def model_name(self) -> str: ...

    @property
    def context_window(self) -> int:
        """Total tokens (prompt + answer) one request may use."""
        ...

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
        """Prompt tokens these messages and tools would take (exact in process, estimated remotely)."""
        ...

    def stream(self, request: ChatRequest) -> AsyncIterator[ModelEvent]:
        """Generate one assistant message; see the module docstring for the contract."""
        ...

    async def aclose(self) -> None:
        """Release connections (the in-process client leaves the engine running: it does not own it)."""
        ...


def estimate_tokens(text: str) -> int:
    """A backend-independent estimate: about 4 characters per token for code and English."""
    return (len(text) + 3) // 4
