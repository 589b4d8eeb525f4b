"""/v1/completions and /v1/responses (the Codex CLI subset), streaming and not."""

from __future__ import annotations

import json

import jsonschema

from tests.backend.server.conftest import LIST_SCHEMA, MODEL, READ_SCHEMA

RESP_TOOLS = [
    {"type": "function", "name": "read", "description": "read a file", "parameters": READ_SCHEMA},
    {"type": "function", "name": "list", "parameters": LIST_SCHEMA},
    {"type": "web_search"},  # non-function tools are ignored
]


def test_completions_non_streaming_and_streaming(client):
    r = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 5
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=[5, 6, 7],
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.prompt_tokens == 3 and chunks[-1].choices == []
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    echoed = client.completions.create(model=MODEL, prompt="abc", max_tokens=2, echo=True, temperature=0)
    assert echoed.choices[0].text.startswith("abc")


def test_responses_non_streaming_with_history(client):
    r = client.responses.create(
        model=MODEL,
        instructions="be brief",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "read a"}]},
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"path": "a"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "contents"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "user", "content": "now list"},
        ],
        tools=RESP_TOOLS,
        tool_choice={"type": "function", "name": "list"},
        max_output_tokens=120,
        temperature=0.5,
        extra_body={"seed": 3},
    )
    assert r.object == "response" and r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "list" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), LIST_SCHEMA)
    assert r.usage.input_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_responses_streaming_events(client):
    events = list(
        client.responses.create(
            model=MODEL,
            input="read something",
            tools=RESP_TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=120,
            stream=True,
            extra_body={"seed": 8},
        )
    )
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert len(added) == 1
    item_id = added[0].item.id
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.item_id == item_id and json.loads(deltas) == json.loads(done.arguments)
    jsonschema.validate(
        json.loads(done.arguments), READ_SCHEMA if added[0].item.name == "read" else LIST_SCHEMA
    )
    final = events[-1].response
    assert final.usage.output_tokens > 0
    assert [o.type for o in final.output][-1] == "function_call"


def test_responses_text_stream(client):
    events = list(client.responses.create(model=MODEL, input="hi", max_output_tokens=6, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text
