"""The chat-turn pipeline: a `TurnRequest` in, one stream of `ModelEvent`s out.

    pipeline = TurnPipeline(engine, tokenizer)             # once per engine
    turn = await pipeline.start(request)                   # renders off the loop; TurnRequestError
    async for event in turn.events():                      # TextDelta … ToolCallReady … ModelDone
        ...

`start` prepares the request in a worker thread (rendering and tokenising the prompt incrementally,
compiling the tool-call grammar) and submits it to the engine. `Turn.events` reads the engine's
stream, feeds its text to the cmd4 parser and yields the events of `mkcode.backend.turn.events`:
each tool call gets a fresh id when it starts, a turn that completed a call finishes with
`tool_calls`, and leaving the iteration early (client gone, user interrupt, task cancelled) cancels
the engine request, which frees its KV pages. The server's endpoints and the agent's in-process
client are thin adapters over this; neither decides anything about a turn on its own.

`engine` is anything with `submit(GenerationRequest) -> RequestStream`, `cancel(request_id)` and
`max_model_len`: tests pass a scripted engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from mkcode.backend.chat.parser import Cmd4StreamParser
from mkcode.backend.turn.constraint import GrammarConstraints
from mkcode.backend.turn.events import (
    ModelDone,
    ModelEvent,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.backend.turn.prepare import Prepared, prepare
from mkcode.backend.turn.prompt import PromptEncoder
from mkcode.backend.turn.request import TurnOptions, TurnRequest, TurnRequestError

log = logging.getLogger("mkcode.turn")


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class TurnPipeline:
    """Turns chat requests into engine requests and engine streams into turn events, for one engine."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        options: TurnOptions | None = None,
        grammars: GrammarConstraints | None = None,
        call_ids: Callable[[], str] = new_call_id,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.options = options or TurnOptions()
        if grammars is None:
            eos = tuple(sorted(set(tokenizer.eos_token_ids) | set(getattr(engine, "eos", ()))))
            grammars = GrammarConstraints(tokenizer, int(engine.cfg.vocab_size), eos)
        self.grammars = grammars
        self.encoder = PromptEncoder(tokenizer)
        self._call_ids = call_ids

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len)

    def count_tokens(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        """Prompt tokens of these messages and (OpenAI-shaped) tools; cached, CPU work."""
        return self.encoder.count(messages, list(tools) if tools else None)

    def prepare(self, request: TurnRequest) -> Prepared:
        """Render, size and constrain the request (CPU work: call from a worker thread)."""
        return prepare(self.options, self.encoder, self.grammars, self.max_model_len, request)

    async def start(self, request: TurnRequest, *, request_id: str | None = None) -> Turn:
        """Prepare the request off the event loop and submit it; `TurnRequestError` if it cannot run."""
        prepared = await asyncio.to_thread(self.prepare, request)
        if request_id is not None:
            prepared.request.request_id = request_id
        return self.submit(prepared)

    def submit(self, prepared: Prepared) -> Turn:
        return Turn(self.engine, self.submit_request(prepared.request), prepared, self._call_ids)

    def submit_request(self, request: Any) -> Any:
        """Queue an engine request (a `GenerationRequest`); the engine's refusals (RequestError,
        SamplingError) become `TurnRequestError`s."""
        from mkcode.backend.engine.request import RequestError
        from mkcode.backend.sampling import SamplingError

        try:
            return self.engine.submit(request)
        except (RequestError, SamplingError) as e:
            code = "context_length_exceeded" if "context" in str(e) else None
            raise TurnRequestError(str(e), code=code) from None


class Turn:
    """One submitted turn; iterate `events()` once."""

    def __init__(self, engine: Any, stream: Any, prepared: Prepared, call_ids: Callable[[], str]) -> None:
        self.engine = engine
        self.stream = stream
        self.prepared = prepared
        self._call_ids = call_ids

    @property
    def prompt_tokens(self) -> int:
        return len(self.prepared.request.prompt_ids)

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    async def events(self) -> AsyncIterator[ModelEvent]:
        """The turn's events, ending with one `ModelDone`. A request without tools gets no tool
        calls: whatever call the model writes is dropped."""
        from mkcode.backend.engine.request import FinishEvent

        parser = Cmd4StreamParser()
        tools = self.prepared.tools_enabled
        ids: dict[int, str] = {}
        streamed: dict[int, list[str]] = {}
        calls = 0
        finished = False

        def convert(events: list[Any]) -> list[ModelEvent]:
            nonlocal calls
            out: list[ModelEvent] = []
            for ev in events:
                if not isinstance(ev, ToolCallBegin | ToolCallArgsDelta | ToolCallReady):
                    out.append(ev)
                elif not tools:
                    continue
                elif isinstance(ev, ToolCallBegin):
                    ids[ev.index] = self._call_ids()
                    streamed[ev.index] = []
                    out.append(ToolCallBegin(ev.index, ids[ev.index], ev.name))
                elif isinstance(ev, ToolCallArgsDelta) and ev.index in ids:
                    streamed[ev.index].append(ev.text)
                    out.append(ev)
                elif isinstance(ev, ToolCallReady) and ev.index in ids:
                    _check_streamed("".join(streamed[ev.index]), ev)
                    calls += 1
                    out.append(ToolCallReady(ev.index, ids[ev.index], ev.name, ev.arguments))
            return out

        try:
            async for ev in self.stream:
                if not isinstance(ev, FinishEvent):
                    for out in convert(parser.feed(ev.text)):
                        yield out
                    continue
                finished = True
                for out in convert(parser.finish()):
                    yield out
                reason = ev.reason
                if reason == "stop" and calls:
                    reason = "tool_calls"
                yield ModelDone(reason, ev.usage, ev.error)
                return
        finally:
            if not finished:
                self.engine.cancel(self.stream.request_id)


def _check_streamed(sent: str, ready: ToolCallReady) -> None:
    """The streamed argument deltas must spell the final arguments (true under the grammar)."""
    try:
        same = json.loads(sent) == json.loads(ready.arguments)
    except ValueError:
        same = False
    if not same:
        log.warning("streamed arguments of call %d differ from the parsed ones", ready.index)
