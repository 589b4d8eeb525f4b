"""OpenAICompatClient against a mock OpenAI-compatible server (httpx MockTransport, real SSE bytes)."""

from __future__ import annotations

import asyncio
import json

import httpx

from mkcode.app.agent import (
    Agent,
    MalformedOutput,
    ModelDone,
    ReasoningChunk,
    TextChunk,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.app.agent.client import ChatRequest
from mkcode.app.agent.openai_compat import OpenAICompatClient
from mkcode.tools import ToolRegistry

from .conftest import collect


def sse(*chunks: dict | str) -> bytes:
    out = []
    for c in chunks:
        out.append(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n")
    return "".join(out).encode()


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    body: dict = {"id": "c1", "object": "chat.completion.chunk", "choices": []}
    if delta is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return body


TOOL_STREAM = sse(
    chunk({"role": "assistant", "reasoning_content": "look first"}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "abc",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"notes.txt"}'}}]}),
    chunk(
        {"tool_calls": [{"index": 1, "id": "def", "function": {"name": "list_dir", "arguments": "{oops"}}]}
    ),
    chunk(finish="tool_calls"),
    chunk(
        usage={"prompt_tokens": 321, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 300}}
    ),
    "[DONE]",
)


def make_client(handler) -> OpenAICompatClient:
    return OpenAICompatClient(
        "http://model.test/v1", "north", api_key="k", transport=httpx.MockTransport(handler)
    )


async def events_of(client: OpenAICompatClient, request: ChatRequest) -> list:
    return [ev async for ev in client.stream(request)]


def test_streams_reasoning_tool_call_deltas_and_usage() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(request.content)
        seen["auth"] = request.headers.get("authorization")
        seen["url"] = str(request.url)
        return httpx.Response(200, content=TOOL_STREAM, headers={"content-type": "text/event-stream"})

    client = make_client(handler)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "reasoning_content": "private", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    evs = asyncio.run(events_of(client, ChatRequest(messages, tools, max_tokens=99)))
    assert seen["url"] == "http://model.test/v1/chat/completions" and seen["auth"] == "Bearer k"
    body = seen["body"]
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 99
    assert body["tools"] == tools and "reasoning_content" not in body["messages"][1]
    assert body["messages"][1]["content"] is None  # OpenAI's shape for a tool-call-only message
    assert evs[0] == ReasoningChunk("look first")
    assert ToolCallBegin(0, "abc", "read_file") in evs
    assert ToolCallReady(0, "abc", "read_file", '{"path": "notes.txt"}') in evs
    bad = [e for e in evs if isinstance(e, MalformedOutput)]
    assert len(bad) == 1 and "list_dir" in bad[0].message and "not valid JSON" in bad[0].message
    done = evs[-1]
    assert isinstance(done, ModelDone) and done.finish_reason == "tool_calls"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.cached_tokens) == (
        321,
        12,
        300,
    )


def test_http_errors_and_unreachable_servers_become_model_done_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "context_length_exceeded: too long"}})

    evs = asyncio.run(events_of(make_client(handler), ChatRequest([{"role": "user", "content": "x"}])))
    assert len(evs) == 1 and evs[0].finish_reason == "error" and "too long" in evs[0].error

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    evs = asyncio.run(events_of(make_client(down), ChatRequest([{"role": "user", "content": "x"}])))
    assert evs[0].finish_reason == "error" and "cannot reach" in evs[0].error

    def mid_stream_error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse(chunk({"content": "a"}), {"error": {"message": "overloaded"}}))

    evs = asyncio.run(
        events_of(make_client(mid_stream_error), ChatRequest([{"role": "user", "content": "x"}]))
    )
    assert evs[0] == TextChunk("a") and evs[-1].finish_reason == "error" and "overloaded" in evs[-1].error


def test_agent_over_an_openai_compatible_server(registry: ToolRegistry) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        if len(calls) == 1:
            stream = sse(
                chunk({"tool_calls": [{"index": 0, "id": "7", "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'}}]}),
                chunk(finish="tool_calls"),
                "[DONE]",
            )  # fmt: skip
        else:
            stream = sse(
                chunk({"content": "It says: remember "}),
                chunk({"content": "the milk."}),
                chunk(finish="stop"),
                "[DONE]",
            )
        return httpx.Response(200, content=stream)

    agent = Agent(make_client(handler), registry)
    events = asyncio.run(collect(agent.run("what is in notes.txt?")))
    assert events[-1].reason == "done"
    tool_msg = calls[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and "remember the milk" in tool_msg["content"]
    assert calls[1]["messages"][-2]["tool_calls"][0]["id"] == tool_msg["tool_call_id"]
    assert agent.session.messages[-1]["content"] == "It says: remember the milk."
