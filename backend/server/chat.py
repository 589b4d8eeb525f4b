"""POST /v1/chat/completions: streaming (SSE) and not, with tools, tool_choice and response_format.

Streaming follows what the OpenAI SDKs and the AI SDK (OpenCode) check: a first chunk with the
role; a tool call's first delta carries `index`, a string `id`, `type` and `function.name`, later
ones only `index` and argument fragments; `finish_reason` is `tool_calls` when the turn called
tools; with `stream_options.include_usage` a last chunk with empty `choices` carries the usage;
then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from mkcode.backend.server import openapi
from mkcode.backend.server.asgi import SSE_DONE, SSEResponse, sse_data, until_disconnect
from mkcode.backend.server.errors import APIError, bad_request, error_body, error_response
from mkcode.backend.server.messages import chat_messages
from mkcode.backend.server.schemas import ChatCompletionRequest, NamedToolChoice, parse_body
from mkcode.backend.server.turn import start_turn
from mkcode.backend.turn.events import (
    ModelDone,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.backend.turn.request import TurnRequest

router = APIRouter()
SYSTEM_FINGERPRINT = "mkcode"


def usage_dict(usage, reasoning_tokens: int | None = None) -> dict[str, Any]:
    out = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def count_reasoning_tokens(tokenizer: Any, reasoning: str, completion_tokens: int) -> int:
    """Tokens of the thinking block: its text re-encoded (the canonical split, which a trained model
    writes) plus its two markers; 0 without reasoning. CPU work: call it off the event loop."""
    if not reasoning:
        return 0
    return min(completion_tokens, len(tokenizer.encode(reasoning)) + 2)


async def reasoning_tokens(tokenizer: Any, reasoning: str, completion_tokens: int) -> int:
    if not reasoning:
        return 0
    return await asyncio.to_thread(count_reasoning_tokens, tokenizer, reasoning, completion_tokens)


def chat_plan(body: ChatCompletionRequest) -> TurnRequest:
    if body.n not in (None, 1):
        raise bad_request("n > 1 is not supported by this server (one choice per request)", param="n")
    if body.logprobs:
        raise bad_request("logprobs are not supported by this server", param="logprobs")
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        choice = choice.function.name
    schema = None
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        schema = {"type": "object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise bad_request("response_format json_schema needs json_schema.schema", param="response_format")
        schema = fmt.json_schema.schema_
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return TurnRequest(
        messages=chat_messages(body.messages),
        tools=[
            t.function.model_dump(exclude_none=True, include={"name", "description", "parameters"})
            for t in body.tools or []
        ],
        tool_choice=choice or "auto",
        parallel=body.parallel_tool_calls is not False,
        answer_schema=schema,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=stop,
    )


@router.post(
    "/v1/chat/completions", responses=openapi.CHAT, openapi_extra=openapi.request_body(ChatCompletionRequest)
)
async def chat_completions(request: Request):
    body = await parse_body(request, ChatCompletionRequest)
    state = request.app.state.mkcode
    model = state.resolve_model(body.model)
    plan = chat_plan(body)
    turn = (await start_turn(state, plan, "messages")).events()
    cid = "chatcmpl-" + secrets.token_hex(12)
    created = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_stream(turn, cid, model, created, include_usage, state.tokenizer))
    end, text, reasoning, calls = await until_disconnect(request, _collect(turn))
    if end.finish_reason == "error":
        return error_response(500, f"generation failed: {end.error}")
    message: dict[str, Any] = {"role": "assistant", "content": text if (text or not calls) else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": end.finish_reason}],
        "usage": usage_dict(
            end.usage, await reasoning_tokens(state.tokenizer, reasoning, end.usage.completion_tokens)
        ),
    }


async def _collect(turn) -> tuple[ModelDone, str, str, list[ToolCallReady]]:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCallReady] = []
    async for ev in turn:
        if isinstance(ev, TextDelta):
            text.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            reasoning.append(ev.text)
        elif isinstance(ev, ToolCallReady):
            calls.append(ev)
        elif isinstance(ev, ModelDone):
            return ev, "".join(text), "".join(reasoning), calls
    raise APIError(500, "generation ended without a finish event")


async def _stream(
    turn, cid: str, model: str, created: int, include_usage: bool, tokenizer: Any
) -> AsyncIterator[bytes]:
    thinking: list[str] = []

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            payload["usage"] = None
        return sse_data(payload)

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for ev in turn:
            if isinstance(ev, TextDelta):
                yield chunk({"content": ev.text})
            elif isinstance(ev, ReasoningDelta):
                thinking.append(ev.text)
                yield chunk({"reasoning_content": ev.text})
            elif isinstance(ev, ToolCallBegin):
                call = {
                    "index": ev.index,
                    "id": ev.call_id,
                    "type": "function",
                    "function": {"name": ev.name, "arguments": ""},
                }
                yield chunk({"tool_calls": [call]})
            elif isinstance(ev, ToolCallArgsDelta):
                yield chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})
            elif isinstance(ev, ModelDone):
                if ev.finish_reason == "error":
                    yield sse_data(error_body(500, f"generation failed: {ev.error}"))
                else:
                    yield chunk({}, ev.finish_reason)
                if include_usage:
                    yield sse_data(
                        {
                            "id": cid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "system_fingerprint": SYSTEM_FINGERPRINT,
                            "choices": [],
                            "usage": usage_dict(
                                ev.usage,
                                await reasoning_tokens(
                                    tokenizer, "".join(thinking), ev.usage.completion_tokens
                                ),
                            ),
                        }
                    )
                yield SSE_DONE
                return
    finally:
        await turn.aclose()
