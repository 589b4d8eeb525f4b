"""A scripted EngineClient: each model call plays the next scripted reply (a list of ModelEvents,
or a callable that builds them from the request), and records every request it was given."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from mkcode.app.agent import (
    ChatRequest,
    MalformedOutput,
    ModelDone,
    ModelEvent,
    TextDelta,
    ToolCallReady,
    Usage,
)
from mkcode.app.agent.client import estimate_tokens

Reply = list[ModelEvent] | Callable[[ChatRequest], list[ModelEvent]]


def call(name: str, index: int = 0, **args: Any) -> ToolCallReady:
    return ToolCallReady(index, str(index), name, json.dumps(args))


def tools_reply(*calls: ToolCallReady) -> list[ModelEvent]:
    return [*calls, ModelDone("tool_calls", Usage(100, 10))]


def text_reply(text: str) -> list[ModelEvent]:
    return [TextDelta(text), ModelDone("stop", Usage(100, 5))]


def malformed_reply(message: str) -> list[ModelEvent]:
    return [MalformedOutput(message), ModelDone("stop", Usage(100, 5))]


class ScriptedClient:
    def __init__(self, replies: Sequence[Reply], *, context_window: int = 100_000, delay_s: float = 0.0):
        self.replies = list(replies)
        self.requests: list[ChatRequest] = []
        self._context_window = context_window
        self.delay_s = delay_s  # pause between events (to interrupt mid-stream)
        self.closed_early = 0  # streams closed before they finished (interrupt reached the client)

    @property
    def model_name(self) -> str:
        return "scripted"

    @property
    def context_window(self) -> int:
        return self._context_window

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
        return estimate_tokens(json.dumps(list(messages)) + json.dumps(list(tools)))

    async def stream(self, request: ChatRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        if not self.replies:
            raise AssertionError("the agent made more model calls than scripted")
        reply = self.replies.pop(0)
        events = reply(request) if callable(reply) else reply
        finished = False
        try:
            for ev in events:
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                yield ev
            finished = True
        finally:
            if not finished:
                self.closed_early += 1

    async def aclose(self) -> None:
        return None
