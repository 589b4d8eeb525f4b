"""Streaming parser of cmd4 generations: text, reasoning and tool calls as typed events.

A cmd4 chatbot turn is ``<|START_THINKING|>plan<|END_THINKING|>`` followed by either
``<|START_RESPONSE|>text<|END_RESPONSE|>`` (or ``<|START_TEXT|>…<|END_TEXT|>``) or an action
``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "read", "parameters": {…}}, …]<|END_ACTION|>``.

``Cmd4StreamParser`` feeds text deltas (from ``IncrementalDetokenizer``) to ``cohere_melody.PyFilter``
(cmd4 options), which splits reasoning, answer text and tool-call pieces as they stream. On top of it,
each action block is checked when it closes (or when the stream ends): its JSON is parsed, and every call
is reported once as ``ToolCallReady`` with canonical JSON ``arguments``. ``ToolCallReady`` is the
authoritative result; ``ToolCallBegin``/``ToolCallArgsDelta`` are the early, best-effort stream (for
OpenAI-style streaming). When the filter streamed no arguments for a call, one ``ToolCallArgsDelta``
with the full arguments precedes its ``ToolCallReady``.

Malformed or truncated output — a block that is not JSON, a call without a name, arguments that are not
a JSON object, a stream that ends inside an action — becomes ``MalformedOutput`` events with a readable
message (for the agent to show the model), never an exception. A call whose arguments are not valid
JSON gets a ``MalformedOutput`` and no ``ToolCallReady``. The event types are the turn's one vocabulary
(``mkcode.backend.turn.events``); ``call_id`` here is the id the model wrote (``"0"``, ``"1"``…).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import cohere_melody

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.turn.events import (
    MalformedOutput,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)

__all__ = ["Cmd4StreamParser", "ParseEvent", "ParsedGeneration", "parse_full"]


ParseEvent = TextDelta | ReasoningDelta | ToolCallBegin | ToolCallArgsDelta | ToolCallReady | MalformedOutput


@dataclass
class ParsedGeneration:
    """A whole generation, parsed: answer text, reasoning, valid tool calls and error messages."""

    content: str
    reasoning: str
    tool_calls: list[ToolCallReady]
    errors: list[str]


@dataclass
class _CallState:
    id: str = ""
    name: str = ""
    args: str = ""
    started: bool = False
    done: bool = False
    pending: list[str] = field(default_factory=list)


def _new_filter(start_in_answer: bool) -> cohere_melody.PyFilter:
    options = cohere_melody.PyFilterOptions().cmd4()
    if start_in_answer:
        options = options.start_in_answer()
    return cohere_melody.PyFilter(options)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


class Cmd4StreamParser:
    """Incremental parser of one cmd4 generation. ``feed`` text deltas, then call ``finish`` once.

    ``start_in_answer`` makes text before any block marker answer text; by default (as Melody's cmd4
    filter does) it is reasoning, since a cmd4 turn opens with its thinking.
    """

    def __init__(self, start_in_answer: bool = False) -> None:
        self._filter = _new_filter(start_in_answer)
        self._broken = False
        self._finished = False
        self._raw: list[str] = []
        self._tail = ""  # raw text not yet scanned for complete action blocks
        self._in_action = False
        self._action_text: list[str] = []
        self._calls: dict[int, _CallState] = {}
        self._next_index = 0  # index of the first call of the next action block

    # -- public API -----------------------------------------------------------------------------------

    def feed(self, text_delta: str) -> list[ParseEvent]:
        """Consume a text delta; return the events it completes."""
        if self._finished or not text_delta:
            return []
        events: list[ParseEvent] = []
        if not self._broken:
            try:
                result = self._filter.write_decoded(text_delta)
            except BaseException as exc:
                self._broken = True
                events.append(MalformedOutput(f"the output could not be parsed incrementally ({exc})"))
            else:
                events += self._convert(result)
        events += self._scan_actions(text_delta)
        return events

    def finish(self) -> list[ParseEvent]:
        """End of generation: flush held-back text and report unfinished or invalid tool calls."""
        if self._finished:
            return []
        self._finished = True
        events: list[ParseEvent] = []
        if not self._broken:
            try:
                events += self._convert(self._filter.flush_partials())
            except BaseException as exc:
                events.append(MalformedOutput(f"the output could not be parsed ({exc})"))
        if self._in_action:
            events += self._finish_block("".join(self._action_text) + self._tail, truncated=True)
            self._in_action = False
        # Calls the filter saw outside any block we could delimit.
        for index in sorted(self._calls):
            if not self._calls[index].done:
                events += self._fallback_call(index)
        return events

    # -- filter results -> events ---------------------------------------------------------------------

    def _convert(self, result: Any) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        if result.reasoning:
            events.append(ReasoningDelta(result.reasoning))
        if result.content:
            events.append(TextDelta(result.content))
        for call in result.tool_calls:
            state = self._calls.setdefault(call.index, _CallState())
            if state.done:
                continue
            # A new call index means every earlier call's header is complete.
            for other in sorted(self._calls):
                if other < call.index and not self._calls[other].done and self._calls[other].name:
                    events += self._start(other)
            state.id += call.id or ""
            state.name += call.name or ""
            if call.arguments:
                state.args += call.arguments
                if state.name:
                    events += self._start(call.index)
                    events.append(ToolCallArgsDelta(call.index, call.arguments))
                else:
                    state.pending.append(call.arguments)
        return events

    def _start(self, index: int) -> list[ParseEvent]:
        state = self._calls[index]
        if state.started:
            return []
        state.started = True
        events: list[ParseEvent] = [ToolCallBegin(index, state.id or str(index), state.name)]
        events += [ToolCallArgsDelta(index, text) for text in state.pending]
        state.pending.clear()
        return events

    # -- action blocks ---------------------------------------------------------------------------------

    def _scan_actions(self, delta: str) -> list[ParseEvent]:
        """Track ``<|START_ACTION|>`` … ``<|END_ACTION|>`` blocks in the raw text; finish closed ones."""
        events: list[ParseEvent] = []
        text = self._tail + delta
        keep = max(len(st.START_ACTION), len(st.END_ACTION)) - 1
        while True:
            if not self._in_action:
                start = text.find(st.START_ACTION)
                if start < 0:
                    self._tail = text[-keep:] if len(text) > keep else text
                    return events
                text = text[start + len(st.START_ACTION) :]
                self._in_action = True
                self._action_text = []
            end = text.find(st.END_ACTION)
            if end < 0:
                # Keep a possible partial END marker unscanned; the rest is block text.
                cut = max(0, len(text) - keep)
                self._action_text.append(text[:cut])
                self._tail = text[cut:]
                return events
            self._action_text.append(text[:end])
            text = text[end + len(st.END_ACTION) :]
            self._in_action = False
            events += self._finish_block("".join(self._action_text), truncated=False)

    def _finish_block(self, block: str, truncated: bool) -> list[ParseEvent]:
        base = self._next_index
        events: list[ParseEvent] = []
        try:
            data = json.loads(block)
        except ValueError as exc:
            if truncated:
                events.append(
                    MalformedOutput(
                        "the output ended inside a tool-call block (<|START_ACTION|> without <|END_ACTION|>)"
                    )
                )
            else:
                events.append(
                    MalformedOutput(
                        f"the tool-call block is not valid JSON ({exc}): {_short(block.strip())!r}"
                    )
                )
            streamed = [i for i in sorted(self._calls) if i >= base and not self._calls[i].done]
            for index in streamed:
                events += self._fallback_call(index)
            self._next_index = max([base, *[i + 1 for i in streamed]])
            return events
        items = data if isinstance(data, list) else [data]
        for k, item in enumerate(items):
            events += self._finish_item(base + k, item)
        self._next_index = base + len(items)
        return events

    def _finish_item(self, index: int, item: Any) -> list[ParseEvent]:
        state = self._calls.setdefault(index, _CallState())
        if state.done:
            return []
        state.done = True
        if not isinstance(item, dict):
            return [
                MalformedOutput(
                    f"tool call {index} is not a JSON object: {_short(json.dumps(item, ensure_ascii=False))}"
                )
            ]
        name = item.get("tool_name")
        if not isinstance(name, str) or not name:
            return [MalformedOutput(f'tool call {index} has no "tool_name" string')]
        params = item.get("parameters", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return [MalformedOutput(f'tool call {index} ({name}): "parameters" must be a JSON object')]
        raw_id = item.get("tool_call_id")
        call_id = str(raw_id) if isinstance(raw_id, str | int) and str(raw_id) else str(index)
        arguments = json.dumps(params, ensure_ascii=False)
        events: list[ParseEvent] = []
        if not state.started:
            state.id, state.name = state.id or call_id, state.name or name
            events += self._start(index)
        if not state.args:
            events.append(ToolCallArgsDelta(index, arguments))
        events.append(ToolCallReady(index, call_id, name, arguments))
        return events

    def _fallback_call(self, index: int) -> list[ParseEvent]:
        """Finish a call from what the filter streamed, when its block could not be parsed."""
        state = self._calls[index]
        if state.done:
            return []
        state.done = True
        if not state.name:
            return [MalformedOutput(f"tool call {index} has no tool name")]
        events: list[ParseEvent] = []
        args = state.args.strip() or "{}"
        try:
            params = json.loads(args)
        except ValueError as exc:
            return [
                MalformedOutput(
                    f"tool call {index} ({state.name}): arguments are not valid JSON ({exc}): {_short(args)!r}"
                )
            ]
        if not isinstance(params, dict):
            return [MalformedOutput(f"tool call {index} ({state.name}): arguments must be a JSON object")]
        events += self._start(index)
        events.append(
            ToolCallReady(index, state.id or str(index), state.name, json.dumps(params, ensure_ascii=False))
        )
        return events


def parse_full(text: str, start_in_answer: bool = False) -> ParsedGeneration:
    """Parse a complete generation (the text after the prompt, up to the end-of-turn token)."""
    parser = Cmd4StreamParser(start_in_answer=start_in_answer)
    events = parser.feed(text) + parser.finish()
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCallReady] = []
    errors: list[str] = []
    for event in events:
        if isinstance(event, TextDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallReady):
            calls.append(event)
        elif isinstance(event, MalformedOutput):
            errors.append(event.message)
    return ParsedGeneration("".join(content), "".join(reasoning), calls, errors)
