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
from typing import Any, Literal, Protocol, runtime_checkable

from mkcode.app.agent.events import Usage

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


@dataclass(frozen=True)
class TextChunk:
    text: str


@dataclass(frozen=True)
class ReasoningChunk:
    text: str


@dataclass(frozen=True)
class ToolCallBegin:
    """A tool call starts streaming (best effort: for showing progress early)."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True)
class ToolCallReady:
    """A complete tool call; `arguments` is a JSON object serialised as a string."""

    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class MalformedOutput:
    """The model wrote something that is not a valid tool call; `message` is written for the model."""

    message: str


ModelFinishReason = Literal["stop", "tool_calls", "length", "cancelled", "error"]


@dataclass(frozen=True)
class ModelDone:
    finish_reason: ModelFinishReason
    usage: Usage
    error: str | None = None


ModelEvent = TextChunk | ReasoningChunk | ToolCallBegin | ToolCallReady | MalformedOutput | ModelDone


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
