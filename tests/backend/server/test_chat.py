"""/v1/models and /v1/chat/completions through the official openai client over real HTTP."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.backend.server.conftest import CONTEXT, LIST_SCHEMA, MODEL, READ_SCHEMA, TOOLS
from tests.backend.server.helpers import assemble_tool_calls, parse_args

USER = [{"role": "user", "content": "hello"}]
SCHEMAS = {"read": READ_SCHEMA, "list": LIST_SCHEMA}


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(server.base_url + "/health").json()["status"] == "ok"
    metrics = httpx.get(server.base_url + "/metrics").text
    assert "mkcode_engine_kv_pages_total" in metrics and "# TYPE mkcode_engine_running gauge" in metrics


def test_chat_non_streaming_shape_and_usage(client):
    messages = [
        {"role": "system", "content": "first system"},
        {"role": "system", "content": [{"type": "text", "text": "second system"}]},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": " two"}]},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, seed=1)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.7,
        top_p=0.9,
        extra_body={"top_k": 50},
        seed=3,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 8
    assert len({c.id for c in chunks}) == 1


def test_seed_is_deterministic(client):
    def run():
        r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=1.0, seed=7)
        return r.choices[0].message.reasoning_content, r.choices[0].message.content

    assert run() == run()


def test_max_tokens_beyond_context_is_clamped(client, runtime):
    """A prompt that leaves ~8 tokens of room, with max_tokens far beyond the context: clamped."""
    words = "alpha beta "
    content = words
    while (
        len(runtime.tokenizer.apply_chat_template([{"role": "user", "content": content + words}]))
        < CONTEXT - 8
    ):
        content += words
    messages = [{"role": "user", "content": content}]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=10**6, temperature=0
    )
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens + r.usage.completion_tokens <= CONTEXT


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "list"}}])
def test_forced_tool_call_streamed_validates(client, choice):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        max_tokens=200,
        stream=True,
        stream_options={"include_usage": True},
        seed=11,
    )
    calls, finish, usage = assemble_tool_calls(list(stream))
    assert finish == "tool_calls" and usage is not None
    assert len(calls) == 1
    call = calls[0]
    if isinstance(choice, dict):
        assert call["name"] == "list"
    assert call["id"].startswith("call_")
    jsonschema.validate(parse_args(call), SCHEMAS[call["name"]])


def test_forced_tool_call_non_streaming_parallel(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=400,
        seed=5,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    ids = [tc.id for tc in choice.message.tool_calls]
    assert len(set(ids)) == len(ids)
    for tc in choice.message.tool_calls:
        jsonschema.validate(json.loads(tc.function.arguments), SCHEMAS[tc.function.name])


def test_auto_tool_calls_are_never_malformed(client):
    """tool_choice auto: free text or a well-formed call; any call must parse and validate."""
    for seed in range(2):
        r = client.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=TOOLS,
            max_tokens=40,
            seed=seed,
            temperature=1.0,
        )
        for tc in r.choices[0].message.tool_calls or []:
            jsonschema.validate(json.loads(tc.function.arguments), SCHEMAS[tc.function.name])


def test_tool_history_round_trip(client):
    """An agent's second turn: assistant tool call + tool result (string and parts) are accepted."""
    messages = [
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "a"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "list", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "file text"},
        {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "a.py"}]},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=5
    )
    assert r.choices[0].message.tool_calls is None


def test_json_schema_response_format(client):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "name": {"type": "string", "maxLength": 10}},
        "required": ["ok", "name"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=120,
        seed=2,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_stop_string_is_not_emitted(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=40, stop=["e"], seed=4)
    msg = r.choices[0].message
    assert "e" not in (msg.content or "") + (msg.reasoning_content or "")
