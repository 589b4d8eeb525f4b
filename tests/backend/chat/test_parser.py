"""Cmd4StreamParser: never raises, reports malformed output as MalformedOutput, round-trips rendered calls."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as hs

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.chat.parser import Cmd4StreamParser, ParseEvent, parse_full
from mkcode.backend.chat.template import chat_template, render_chat
from mkcode.backend.turn.events import (
    MalformedOutput,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)

from .strategies import json_objects_of, marker_free_text

_markers = hs.sampled_from(
    [
        *st.SPECIAL_TOKENS,
        "[",
        "]",
        "{",
        "}",
        '"',
        ",",
        ":",
        '"tool_call_id": "0"',
        '"tool_name": "f"',
        '"parameters": ',
        "<|",
        "|>",
        "<|START_",
    ]
)
_garbage = hs.lists(hs.one_of(_markers, hs.text(max_size=6)), max_size=25).map("".join)


def stream(text_: str, cuts: list[int]) -> list[ParseEvent]:
    parser = Cmd4StreamParser()
    events: list[ParseEvent] = []
    pos = 0
    for cut in sorted(set(cuts)):
        events += parser.feed(text_[pos:cut])
        pos = cut
    events += parser.feed(text_[pos:])
    return events + parser.finish()


@settings(max_examples=200, deadline=None)
@given(data=hs.data(), garbage=_garbage)
def test_never_raises_on_garbage(data: hs.DataObject, garbage: str) -> None:
    cuts = data.draw(hs.lists(hs.integers(0, len(garbage)), max_size=8))
    events = stream(garbage, cuts)
    done = [e for e in events if isinstance(e, ToolCallReady)]
    for call in done:
        assert isinstance(json.loads(call.arguments), dict)
    started = {e.index for e in events if isinstance(e, ToolCallBegin)}
    assert {c.index for c in done} <= started
    parse_full(garbage)


def _assistant_turn(calls: list[dict[str, Any]], reasoning: str) -> str:
    """The generated part of a rendered assistant tool-call turn (what the model would write)."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "reasoning": reasoning, "tool_calls": calls},
    ]
    rendered = render_chat(chat_template(), messages, add_generation_prompt=False)
    start = rendered.rindex(st.START_OF_TURN + st.CHATBOT) + len(st.START_OF_TURN + st.CHATBOT)
    assert rendered.endswith(st.END_OF_TURN)
    return rendered[start : -len(st.END_OF_TURN)]


_names = marker_free_text.filter(bool)
# Melody's filter trims reasoning; keep to characters whose whitespace-ness Rust and Python agree on.
_reasoning = hs.text(hs.characters(whitelist_categories=("L", "N", "P", "Zs")), max_size=20).filter(
    lambda s: "<|" not in s
)


@settings(max_examples=100, deadline=None)
@given(
    data=hs.data(),
    calls=hs.lists(hs.tuples(_names, json_objects_of(marker_free_text)), min_size=1, max_size=3),
    reasoning=_reasoning,
)
def test_rendered_tool_calls_parse_back(
    data: hs.DataObject, calls: list[tuple[str, dict[str, Any]]], reasoning: str
) -> None:
    openai_calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)
    ]
    generation = _assistant_turn(openai_calls, reasoning)
    cuts = data.draw(hs.lists(hs.integers(0, len(generation)), max_size=10))
    events = stream(generation, cuts)
    assert not [e for e in events if isinstance(e, MalformedOutput)]
    done = [e for e in events if isinstance(e, ToolCallReady)]
    assert [(d.index, d.call_id, d.name) for d in done] == [(i, str(i), n) for i, (n, _) in enumerate(calls)]
    assert [json.loads(d.arguments) for d in done] == [a for _, a in calls]
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == reasoning.strip()
    assert not [e for e in events if isinstance(e, TextDelta)]
    # Each call is announced once, before its arguments and its completion.
    for d in done:
        kinds = [type(e) for e in events if getattr(e, "index", None) == d.index]
        assert kinds[0] is ToolCallBegin and kinds[-1] is ToolCallReady and kinds.count(ToolCallBegin) == 1
        assert ToolCallArgsDelta in kinds


@settings(max_examples=100, deadline=None)
@given(reasoning=_reasoning, answer=_reasoning)
def test_text_answer(reasoning: str, answer: str) -> None:
    """Reasoning and answer come back whole; Melody's filter trims the whitespace around them."""
    generation = (
        f"{st.START_THINKING}{reasoning}{st.END_THINKING}{st.START_RESPONSE}{answer}{st.END_RESPONSE}"
    )
    parsed = parse_full(generation)
    assert (parsed.reasoning, parsed.content.strip(), parsed.tool_calls, parsed.errors) == (
        reasoning.strip(),
        answer.strip(),
        [],
        [],
    )


def test_malformed_tool_calls_become_errors() -> None:
    cases = {
        f"{st.START_ACTION}not json{st.END_ACTION}": "not valid JSON",
        f'{st.START_ACTION}[{{"tool_call_id": "0", "tool_name": "f", "parameters": {{"a": ': "ended inside a tool-call block",
        f'{st.START_ACTION}[{{"tool_call_id": "0", "tool_name": "f", "parameters": "x"}}]{st.END_ACTION}': "must be a JSON object",
        f'{st.START_ACTION}[{{"tool_call_id": "0", "parameters": {{}}}}]{st.END_ACTION}': "tool_name",
        f"{st.START_ACTION}[1]{st.END_ACTION}": "not a JSON object",
    }
    for generation, fragment in cases.items():
        parsed = parse_full(generation)
        assert parsed.tool_calls == []
        assert any(fragment in e for e in parsed.errors), (generation, parsed.errors)


def test_key_order_and_unterminated_block() -> None:
    # Melody's filter expects tool_call_id before tool_name; the block check recovers either order.
    parsed = parse_full(
        f'{st.START_ACTION}[{{"tool_name": "f", "tool_call_id": "7", "parameters": {{"x": 1}}}}]{st.END_ACTION}'
    )
    assert parsed.tool_calls == [ToolCallReady(0, "7", "f", '{"x": 1}')] and parsed.errors == []
    # A complete JSON list whose <|END_ACTION|> never came is still a valid call.
    parsed = parse_full(f'{st.START_ACTION}[{{"tool_call_id": "0", "tool_name": "f", "parameters": {{}}}}]')
    assert parsed.tool_calls == [ToolCallReady(0, "0", "f", "{}")]
