"""One chat turn through the engine: token events → text, reasoning and tool-call events.

`run_turn` submits a prepared request, reads its `RequestStream` on the event loop, feeds the
text to `Cmd4StreamParser` and yields `TurnEvent`s that the chat and Responses endpoints turn
into their wire formats. Each tool call gets a fresh OpenAI-style id (`call_…`) when it starts.
Leaving the iteration early (client gone, task cancelled) cancels the engine request, which frees
its KV pages.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from mkcode.backend.chat.parser import Cmd4StreamParser
from mkcode.backend.engine.request import (
    FinishEvent,
    GenerationRequest,
    RequestError,
    RequestStream,
    TokenEvent,
    Usage,
)
from mkcode.backend.sampling import SamplingError
from mkcode.backend.server.errors import bad_request
from mkcode.backend.turn.events import (
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)

log = logging.getLogger("mkcode.server")


@dataclass
class TextOut:
    text: str


@dataclass
class ReasoningOut:
    text: str


@dataclass
class CallStart:
    index: int
    call_id: str
    name: str


@dataclass
class CallArgs:
    index: int
    text: str


@dataclass
class CallDone:
    index: int
    call_id: str
    name: str
    arguments: str


@dataclass
class TurnEnd:
    finish_reason: str  # stop | length | tool_calls | cancelled | error
    usage: Usage
    calls: list[CallDone] = field(default_factory=list)
    error: str | None = None


TurnEvent = TextOut | ReasoningOut | CallStart | CallArgs | CallDone | TurnEnd


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def submit(engine, request: GenerationRequest) -> RequestStream:
    """Queue the request; the engine's refusals (RequestError, SamplingError) become 400s."""
    try:
        return engine.submit(request)
    except (RequestError, SamplingError) as e:
        code = "context_length_exceeded" if "context" in str(e) else None
        raise bad_request(str(e), code=code) from None


async def run_turn(engine, stream: RequestStream, *, tools: bool) -> AsyncIterator[TurnEvent]:
    """Yield the events of one submitted chat turn; `tools` False drops any tool call the model
    writes (a request without tools gets text only)."""
    parser = Cmd4StreamParser()
    ids: dict[int, str] = {}
    streamed: dict[int, list[str]] = {}
    calls: list[CallDone] = []
    finished = False

    def convert(events) -> list[TurnEvent]:
        out: list[TurnEvent] = []
        for ev in events:
            if isinstance(ev, TextDelta):
                out.append(TextOut(ev.text))
            elif isinstance(ev, ReasoningDelta):
                out.append(ReasoningOut(ev.text))
            elif not tools:
                continue
            elif isinstance(ev, ToolCallBegin):
                ids[ev.index] = new_call_id()
                streamed[ev.index] = []
                out.append(CallStart(ev.index, ids[ev.index], ev.name))
            elif isinstance(ev, ToolCallArgsDelta) and ev.index in ids:
                streamed[ev.index].append(ev.text)
                out.append(CallArgs(ev.index, ev.text))
            elif isinstance(ev, ToolCallReady) and ev.index in ids:
                sent = "".join(streamed[ev.index])
                try:
                    same = json.loads(sent) == json.loads(ev.arguments)
                except ValueError:
                    same = False
                if not same:  # cannot happen under the grammar; say so loudly if it does
                    log.warning("streamed arguments of call %d differ from the parsed ones", ev.index)
                done = CallDone(ev.index, ids[ev.index], ev.name, ev.arguments)
                calls.append(done)
                out.append(done)
        return out

    try:
        async for ev in stream:
            if isinstance(ev, TokenEvent):
                for out in convert(parser.feed(ev.text)):
                    yield out
                continue
            assert isinstance(ev, FinishEvent)
            finished = True
            for out in convert(parser.finish()):
                yield out
            reason = ev.reason
            if reason == "stop" and calls:
                reason = "tool_calls"
            yield TurnEnd(reason, ev.usage, calls, ev.error)
            return
    finally:
        if not finished:
            engine.cancel(stream.request_id)
