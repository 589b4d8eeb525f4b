"""TurnPipeline over a scripted engine: the event stream, tool-call ids and finish reasons, the grammar
it attaches, early close cancelling the engine request, refusals as TurnRequestError."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.turn.events import (
    MalformedOutput,
    ModelDone,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.backend.turn.pipeline import TurnPipeline
from mkcode.backend.turn.request import TurnRequest, TurnRequestError

from .fakes import ScriptedEngine

TOOLS = [{"name": "read", "description": "read a file", "parameters": {"type": "object"}}]
MESSAGES = [{"role": "user", "content": "hi"}]


def call_text(name: str, args: dict, plan: str = "Read it.") -> str:
    block = json.dumps({"tool_call_id": "0", "tool_name": name, "parameters": args})
    return f"{st.START_THINKING}{plan}{st.END_THINKING}{st.START_ACTION}[\n    {block}\n]{st.END_ACTION}"


def answer_text(text: str, plan: str = "Easy.") -> str:
    return f"{st.START_THINKING}{plan}{st.END_THINKING}{st.START_RESPONSE}{text}{st.END_RESPONSE}"


def _pipeline(tok, texts: list[str], **kw) -> tuple[TurnPipeline, ScriptedEngine]:
    engine = ScriptedEngine(tok, texts)
    ids = (f"call_{i}" for i in itertools.count())
    return TurnPipeline(engine, tok, call_ids=lambda: next(ids), **kw), engine


def _run(pipeline: TurnPipeline, request: TurnRequest) -> list:
    async def go():
        turn = await pipeline.start(request)
        return [ev async for ev in turn.events()]

    return asyncio.run(go())


def test_a_tool_call_turn(tok) -> None:
    pipeline, engine = _pipeline(tok, [call_text("read", {"path": "a.py"})])
    events = _run(pipeline, TurnRequest(MESSAGES, TOOLS))
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Read it."
    (begin,) = [e for e in events if isinstance(e, ToolCallBegin)]
    (ready,) = [e for e in events if isinstance(e, ToolCallReady)]
    assert (begin.index, begin.call_id, begin.name) == (0, "call_0", "read")
    assert (ready.call_id, ready.name, json.loads(ready.arguments)) == ("call_0", "read", {"path": "a.py"})
    args = "".join(e.text for e in events if isinstance(e, ToolCallArgsDelta))
    assert json.loads(args) == {"path": "a.py"}
    done = events[-1]
    assert isinstance(done, ModelDone) and done.finish_reason == "tool_calls"
    assert done.usage.prompt_tokens == len(engine.requests[0].prompt_ids)
    assert engine.requests[0].prompt_ids == tok.apply_chat_template(
        MESSAGES, [{"type": "function", "function": TOOLS[0]}], True
    )
    assert engine.requests[0].constraint is not None  # tool calls are grammar-constrained


def test_a_text_turn_and_a_request_without_tools(tok) -> None:
    pipeline, engine = _pipeline(tok, [answer_text("Hello there."), call_text("read", {})])
    events = _run(pipeline, TurnRequest(MESSAGES, TOOLS))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello there."
    assert events[-1] == ModelDone("stop", events[-1].usage)
    # Without tools the model's call is dropped, and no grammar is needed.
    events = _run(pipeline, TurnRequest(MESSAGES))
    assert not [e for e in events if isinstance(e, ToolCallBegin | ToolCallReady)]
    assert events[-1].finish_reason == "stop" and engine.requests[1].constraint is None


def test_malformed_output_is_reported_for_the_model(tok) -> None:
    bad = f"{st.START_THINKING}x{st.END_THINKING}{st.START_ACTION}[not json]{st.END_ACTION}"
    pipeline, _ = _pipeline(tok, [bad], options=None)
    events = _run(pipeline, TurnRequest(MESSAGES, TOOLS))
    assert [e for e in events if isinstance(e, MalformedOutput)]
    assert events[-1].finish_reason == "stop"


def test_closing_early_cancels_the_engine_request(tok) -> None:
    pipeline, engine = _pipeline(tok, [answer_text("word " * 50)])

    async def go():
        turn = await pipeline.start(TurnRequest(MESSAGES))
        events = turn.events()
        async for _ in events:
            break
        await events.aclose()
        return turn.request_id

    request_id = asyncio.run(go())
    assert engine.cancelled == {request_id}


def test_refusals(tok) -> None:
    pipeline, _ = _pipeline(tok, ["x"])
    with pytest.raises(TurnRequestError) as e:
        _run(pipeline, TurnRequest([{"role": "user", "content": "x " * 70000}]))
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(TurnRequestError) as e:
        _run(pipeline, TurnRequest(MESSAGES, TOOLS, tool_choice="write"))
    assert e.value.param == "tool_choice"
    with pytest.raises(TurnRequestError):
        _run(pipeline, TurnRequest(MESSAGES, TOOLS + TOOLS))
