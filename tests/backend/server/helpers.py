"""Assembling streamed chat tool calls the way clients do (keyed by index, arguments concatenated)."""

from __future__ import annotations

import json
from typing import Any


def assemble_tool_calls(chunks: list[Any]) -> tuple[dict[int, dict[str, Any]], str | None, Any]:
    """(calls by index, finish_reason, usage) from openai ChatCompletionChunk objects; asserts the
    first delta of each call carries index, a string id and the function name (as the AI SDK needs)."""
    calls: dict[int, dict[str, Any]] = {}
    finish, usage = None, None
    for ch in chunks:
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            if choice.finish_reason:
                finish = choice.finish_reason
            for tc in choice.delta.tool_calls or []:
                assert isinstance(tc.index, int)
                if tc.index not in calls:
                    assert isinstance(tc.id, str) and tc.id, "first delta of a call must carry a string id"
                    assert tc.function.name, "first delta of a call must carry function.name"
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id in (None, calls[tc.index]["id"])
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    return calls, finish, usage


def parse_args(call: dict[str, Any]) -> Any:
    return json.loads(call["arguments"])
