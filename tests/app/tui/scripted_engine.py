"""A scripted `EngineClient` for front-end tests: each model call plays the next scripted step.

    client = ScriptedClient([
        text_step("Let me look."),                       # step 1: text, then tool calls, then done
        tool_step("edit_file", {"path": "a.py", ...}),
        text_step("Done: renamed it."),
    ])

A step is a list of `ModelEvent`s with optional pauses: a float sleeps that many seconds, an
`asyncio.Event` waits until it is set (tests use one to hold the model "mid-generation"). A step
without a `ModelDone` gets one (`tool_calls` when it made any, else `stop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from mkcode.app.agent.client import (
    ChatRequest,
    ModelDone,
    ModelEvent,
    ReasoningChunk,
    TextChunk,
    ToolCallReady,
    estimate_tokens,
)
from mkcode.app.agent.events import Usage
from mkcode.app.core.backend import Backend, BackendMetrics

Step = list[Any]


def text_step(text: str, *, chunk: int = 4, reasoning: str = "", pause: float = 0.0) -> Step:
    out: Step = [ReasoningChunk(reasoning)] if reasoning else []
    for i in range(0, len(text), chunk):
        out.append(TextChunk(text[i : i + chunk]))
        if pause:
            out.append(pause)
    return out


def tool_step(name: str, args: dict[str, Any], *, text: str = "", index: int = 0) -> Step:
    import json

    out: Step = [TextChunk(text)] if text else []
    out.append(ToolCallReady(index, f"model_{index}", name, json.dumps(args)))
    return out


class ScriptedClient:
    def __init__(
        self, steps: Sequence[Step], *, context_window: int = 8192, model_name: str = "scripted-model"
    ) -> None:
        self.steps = list(steps)
        self.requests: list[ChatRequest] = []
        self.cancelled = 0
        self._context_window = context_window
        self._model_name = model_name

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_window(self) -> int:
        return self._context_window

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
        return sum(estimate_tokens(str(m.get("content") or "")) for m in messages) + 10 * len(tools)

    async def stream(self, request: ChatRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        step = self.steps.pop(0) if self.steps else [TextChunk("(end of script)")]
        made_call = False
        finished = False
        try:
            for item in step:
                if isinstance(item, float | int):
                    await asyncio.sleep(item)
                    continue
                if isinstance(item, asyncio.Event):
                    await item.wait()
                    continue
                made_call |= isinstance(item, ToolCallReady)
                if isinstance(item, ModelDone):
                    finished = True
                yield item
            if not finished:
                finished = True
                yield ModelDone("tool_calls" if made_call else "stop", Usage(100, 20))
        finally:
            if not finished:
                self.cancelled += 1

    async def aclose(self) -> None:
        return None


def scripted_backend(steps: Sequence[Step], **kwargs: Any) -> Backend:
    client = ScriptedClient(steps, **kwargs)
    return Backend(
        client,
        "scripted",
        "scripted · test",
        metrics_fn=lambda: BackendMetrics(decode_tokens_per_s=42.0, kv_usage=0.1),
    )
