"""`InProcessClient`: the agent's model backend over the in-process Engine.

The chat is rendered with the checkpoint's chat template (tool schemas included) and encoded by the
`ChatTokenizer`; the engine's text deltas go through the cmd4 stream parser, whose events become
the agent's `ModelEvent`s. Torch and the engine are only imported when a client is built.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mkcode.app.agent.client import (
    ChatRequest,
    ModelDone,
    ModelEvent,
    ToolCallArgsDelta,
    ToolCallReady,
)
from mkcode.app.agent.events import Usage

if TYPE_CHECKING:
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.engine.engine import Engine
    from mkcode.backend.runtime import Runtime

_ids = itertools.count(1)


def model_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template wants them (content None → "")."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


class InProcessClient:
    """An `EngineClient` over a local `Engine` and `ChatTokenizer` (it starts the engine thread if
    needed, and never shuts the engine down: whoever built it owns it)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: ChatTokenizer,
        *,
        model_name: str = "local",
        context_window: int | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self._model_name = model_name
        self._context_window = min(context_window or engine.max_model_len, engine.max_model_len)

    @classmethod
    def from_runtime(cls, runtime: Runtime) -> InProcessClient:
        return cls(runtime.engine, runtime.tokenizer, model_name=runtime.model_name)  # type: ignore[arg-type]

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_window(self) -> int:
        return self._context_window

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[int]:
        return self.tokenizer.apply_chat_template(model_messages(messages), list(tools) or None, True)

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
        return len(self.encode(messages, tools))

    async def stream(self, request: ChatRequest) -> AsyncIterator[ModelEvent]:
        from mkcode.backend.chat import parser as p
        from mkcode.backend.engine.request import FinishEvent, GenerationRequest, RequestError
        from mkcode.backend.sampling import SamplingError, SamplingParams

        try:
            ids = self.encode(request.messages, request.tools)
            sampling = SamplingParams(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=request.seed,
            )
            req = GenerationRequest(ids, sampling, request_id=f"agent-{next(_ids)}")
            self.engine.start()
            stream = self.engine.submit(req)
        except (RequestError, SamplingError, ValueError) as e:
            yield ModelDone("error", Usage(), str(e))
            return
        parser = p.Cmd4StreamParser()
        finished = False
        saw_call = False
        try:
            async for ev in stream:
                if isinstance(ev, FinishEvent):
                    finished = True
                    for out in _convert(parser.finish()):
                        saw_call |= isinstance(out, ToolCallReady)
                        yield out
                    reason = ev.reason
                    if reason == "stop" and saw_call:
                        reason = "tool_calls"
                    usage = Usage(ev.usage.prompt_tokens, ev.usage.completion_tokens, ev.usage.cached_tokens)
                    yield ModelDone(reason, usage, ev.error)  # type: ignore[arg-type]
                    return
                for out in _convert(parser.feed(ev.text)):
                    saw_call |= isinstance(out, ToolCallReady)
                    yield out
        finally:
            if not finished:  # closed early (interrupt): free the engine's slot now
                self.engine.cancel(req.request_id)

    async def aclose(self) -> None:
        return None


def _convert(events: list[Any]) -> list[ModelEvent]:
    """The parser's events, less the argument deltas (the agent acts on complete calls only)."""
    return [ev for ev in events if not isinstance(ev, ToolCallArgsDelta)]
