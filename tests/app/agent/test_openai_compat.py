"""OpenAICompatClient against a mock OpenAI-compatible server (httpx MockTransport, real SSE bytes)."""

from __future__ import annotations

import asyncio
import json

import httpx

from mkcode.app.agent import (
    Agent,
    MalformedOutput,
    ModelDone,
    ReasoningDelta,
    TextDelta,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.app.agent.client import ChatRequest
from mkcode.app.agent.openai_compat import OpenAICompatClient, RetryPolicy
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


SSE = {"content-type": "text/event-stream"}
NO_WAIT = RetryPolicy(attempts=3, base_delay_s=0.0)


def make_client(handler, retry: RetryPolicy = NO_WAIT) -> OpenAICompatClient:
    return OpenAICompatClient(
        "http://model.test/v1", "north", api_key="k", transport=httpx.MockTransport(handler), retry=retry
    )


async def events_of(client: OpenAICompatClient, request: ChatRequest) -> list:
    return [ev async for ev in client.stream(request)]


def test_streams_reasoning_tool_call_deltas_and_usage() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(request.content)
        seen["auth"] = request.headers.get("authorization")
        seen["url"] = str(request.url)
        return httpx.Response(200, content=TOOL_STREAM, headers=SSE)

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
    assert evs[0] == ReasoningDelta("look first")
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
    assert evs[0].finish_reason == "error" and "cannot reach" in evs[0].error and "3 attempts" in evs[0].error

    def not_a_stream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": []})

    evs = asyncio.run(events_of(make_client(not_a_stream), ChatRequest([{"role": "user", "content": "x"}])))
    assert len(evs) == 1 and evs[0].finish_reason == "error" and "did not stream" in evs[0].error

    def mid_stream_error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=sse(chunk({"content": "a"}), {"error": {"message": "overloaded"}}), headers=SSE
        )

    evs = asyncio.run(
        events_of(make_client(mid_stream_error), ChatRequest([{"role": "user", "content": "x"}]))
    )
    assert evs[0] == TextDelta("a") and evs[-1].finish_reason == "error" and "overloaded" in evs[-1].error


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
        return httpx.Response(200, content=stream, headers=SSE)

    agent = Agent(make_client(handler), registry)
    events = asyncio.run(collect(agent.run("what is in notes.txt?")))
    assert events[-1].reason == "done"
    tool_msg = calls[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and "remember the milk" in tool_msg["content"]
    assert calls[1]["messages"][-2]["tool_calls"][0]["id"] == tool_msg["tool_call_id"]
    assert agent.session.messages[-1]["content"] == "It says: remember the milk."


HELLO = sse(chunk({"content": "hello"}), chunk(finish="stop"), "[DONE]")


def _flaky(failures: list) -> tuple[list[httpx.Request], object]:
    """A handler that answers with `failures` in turn (an exception is raised), then streams HELLO."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) <= len(failures):
            f = failures[len(seen) - 1]
            if isinstance(f, Exception):
                raise f
            return f
        return httpx.Response(200, content=HELLO, headers=SSE)

    return seen, handler


def test_connect_errors_429_and_5xx_are_retried_then_the_stream_is_read() -> None:
    seen, handler = _flaky(
        [
            httpx.ConnectError("connection refused"),
            httpx.Response(429, json={"error": {"message": "slow down"}}, headers={"retry-after": "0"}),
            httpx.Response(503, text="warming up"),
        ]
    )
    client = make_client(handler, RetryPolicy(attempts=4, base_delay_s=0.0))
    evs = asyncio.run(events_of(client, ChatRequest([{"role": "user", "content": "x"}])))
    assert len(seen) == 4
    assert [json.loads(r.content) for r in seen[1:]] == [json.loads(seen[0].content)] * 3  # same body
    assert evs[0] == TextDelta("hello") and evs[-1].finish_reason == "stop"


def test_retries_stop_at_the_limit_and_client_errors_are_not_retried() -> None:
    seen, handler = _flaky([httpx.Response(502, text="bad gateway")] * 5)
    evs = asyncio.run(events_of(make_client(handler), ChatRequest([{"role": "user", "content": "x"}])))
    assert len(seen) == 3  # NO_WAIT.attempts
    assert (
        evs[0].finish_reason == "error" and "HTTP 502" in evs[0].error and "after 3 attempts" in evs[0].error
    )

    seen, handler = _flaky([httpx.Response(401, json={"error": {"message": "bad key"}})])
    evs = asyncio.run(events_of(make_client(handler), ChatRequest([{"role": "user", "content": "x"}])))
    assert len(seen) == 1 and "bad key" in evs[0].error and "attempts" not in evs[0].error


def test_a_broken_stream_is_not_retried() -> None:
    calls = []

    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield sse(chunk({"content": "par"}))
            raise httpx.ReadError("connection reset")

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, stream=Broken(), headers=SSE)

    evs = asyncio.run(events_of(make_client(handler), ChatRequest([{"role": "user", "content": "x"}])))
    assert len(calls) == 1
    assert evs[0] == TextDelta("par") and evs[-1].finish_reason == "error" and "broke off" in evs[-1].error


def test_backoff_doubles_up_to_the_cap_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=6, base_delay_s=0.5, max_delay_s=3.0)
    assert [policy.delay(n) for n in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert policy.delay(0, "2") == 2.0 and policy.delay(0, "120") == 3.0
    assert policy.delay(1, "Wed, 21 Oct 2015 07:28:00 GMT") == 1.0
