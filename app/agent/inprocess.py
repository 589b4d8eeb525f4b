"""`InProcessClient`: the agent's model backend over the in-process Engine.

A thin adapter over the turn pipeline (`mkcode.backend.turn`), the same one `mkcode serve` runs:
the chat is rendered with the checkpoint's chat template off the event loop (incrementally: the
history's tokens are cached per message), tool calls are grammar-constrained (llguidance, tool_choice
`auto`), and the engine's text is parsed into the turn's events. The client passes those events on,
less the argument deltas (the agent acts on complete calls). Torch and the engine are only imported
when a client is built.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mkcode.app.agent.client import ChatRequest, ModelDone, ModelEvent, ToolCallArgsDelta
from mkcode.app.agent.events import Usage

if TYPE_CHECKING:
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.engine.engine import Engine
    from mkcode.backend.runtime import Runtime
    from mkcode.backend.turn.pipeline import TurnPipeline

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
    needed, and never shuts the engine down: whoever built it owns it). `grammar=False` decodes tool
    calls freely (the parser then reports what does not parse)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: ChatTokenizer,
        *,
        model_name: str = "local",
        context_window: int | None = None,
        grammar: bool = True,
        pipeline: TurnPipeline | None = None,
    ) -> None:
        from mkcode.backend.turn.pipeline import TurnPipeline
        from mkcode.backend.turn.request import TurnOptions

        self.engine = engine
        self.tokenizer = tokenizer
        self.pipeline = pipeline or TurnPipeline(engine, tokenizer, options=TurnOptions(grammar=grammar))
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
        """The prompt's ids (cached per message: CPU work, call it off the event loop)."""
        return self.pipeline.encoder.encode(model_messages(messages), list(tools) or None)

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
        return len(self.encode(messages, tools))

    async def stream(self, request: ChatRequest) -> AsyncIterator[ModelEvent]:
        from mkcode.backend.turn.request import TurnRequest, TurnRequestError, flat_tools

        turn_request = TurnRequest(
            messages=model_messages(request.messages),
            tools=flat_tools(request.tools),
            tool_choice="auto",
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
        )
        try:
            self.engine.start()
            turn = await self.pipeline.start(turn_request, request_id=f"agent-{next(_ids)}")
        except (TurnRequestError, ValueError) as e:
            yield ModelDone("error", Usage(), str(e))
            return
        events = turn.events()
        try:
            async for ev in events:
                if not isinstance(ev, ToolCallArgsDelta):
                    yield ev
        finally:  # closed early (interrupt): the pipeline cancels the engine request
            await events.aclose()

    async def aclose(self) -> None:
        return None
