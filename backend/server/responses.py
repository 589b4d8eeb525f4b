"""POST /v1/responses: the subset of OpenAI's Responses API that Codex CLI uses.

Input: `instructions`, `input` as a string or items (messages with text parts, `function_call`,
`function_call_output`; reasoning items are skipped), function tools, `tool_choice`,
`parallel_tool_calls`, `max_output_tokens`, sampling fields, `text.format` (JSON output).
Output items: a `reasoning` item for the plan, a `message` with `output_text`, and one
`function_call` item per call. Streaming sends the typed events Codex reads: response.created,
response.in_progress, response.output_item.added/done, response.content_part.added/done,
response.output_text.delta/done, response.reasoning_text.delta/done,
response.function_call_arguments.delta/done, then response.completed (or .incomplete/.failed)
carrying the whole response with its usage. Nothing is stored: `previous_response_id` is refused.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from mkcode.backend.server import openapi
from mkcode.backend.server.asgi import SSEResponse, sse_event, until_disconnect
from mkcode.backend.server.chat import reasoning_tokens
from mkcode.backend.server.errors import bad_request, error_response
from mkcode.backend.server.messages import responses_messages
from mkcode.backend.server.schemas import ResponsesNamedChoice, ResponsesRequest, parse_body
from mkcode.backend.server.turn import start_turn
from mkcode.backend.turn.events import (
    ModelDone,
    ModelEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.backend.turn.request import TurnRequest

router = APIRouter()


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def responses_plan(body: ResponsesRequest) -> TurnRequest:
    if body.previous_response_id:
        raise bad_request(
            "previous_response_id is not supported: this server stores no responses; send the whole input",
            param="previous_response_id",
        )
    tools = [
        {
            k: v
            for k, v in (("name", t.name), ("description", t.description), ("parameters", t.parameters))
            if v is not None
        }
        for t in body.tools or []
        if t.type == "function" and t.name
    ]
    choice = body.tool_choice
    if isinstance(choice, ResponsesNamedChoice):
        choice = choice.name
    schema = None
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type == "json_object":
        schema = {"type": "object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise bad_request("text.format json_schema needs a schema", param="text.format")
        schema = fmt.schema_
    return TurnRequest(
        messages=responses_messages(body.instructions, body.input),
        tools=tools,
        tool_choice=choice or "auto",
        parallel=body.parallel_tool_calls is not False,
        answer_schema=schema,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
    )


class ResponseBuilder:
    """Turns turn events into Responses output items and the stream events announcing them."""

    def __init__(self, body: ResponsesRequest, model: str, tokenizer: Any = None):
        self.tokenizer = tokenizer  # counts the reasoning tokens of the usage
        self.reasoning_tokens = 0
        self.id = _id("resp")
        self.body = body
        self.model = model
        self.created = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.seq = 0
        self._open: dict[str, Any] | None = None  # the reasoning or message item being written
        self._calls: dict[int, dict[str, Any]] = {}  # call index -> function_call item

    def event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, payload

    def response(self, status: str, usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": self.model,
            "output": self.output if status != "in_progress" else [],
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": b.reasoning,
            "store": False,
            "temperature": b.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": b.tool_choice.model_dump()
            if hasattr(b.tool_choice, "model_dump")
            else (b.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or []],
            "top_p": b.top_p,
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
            **extra,
        }

    def _close_open(self) -> list[tuple[str, dict[str, Any]]]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self.output.index(item)
        item["status"] = "completed"
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            return [
                self.event(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                ),
                self.event("response.output_item.done", output_index=index, item=item),
            ]
        part = item["content"][0]
        return [
            self.event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self.event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _open_item(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        events = self._close_open()
        if kind == "reasoning":
            item = {
                "type": "reasoning",
                "id": _id("rs"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
                "status": "in_progress",
            }
        else:
            item = {
                "type": "message",
                "id": _id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        self.output.append(item)
        self._open = item
        index = len(self.output) - 1
        events.append(self.event("response.output_item.added", output_index=index, item=_snapshot(item)))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(
                self.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                )
            )
            item["content"].append(part)
        return events

    def feed(self, ev: ModelEvent) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        if isinstance(ev, ReasoningDelta | TextDelta):
            kind = "reasoning" if isinstance(ev, ReasoningDelta) else "message"
            if self._open is None or self._open["type"] != kind:
                events += self._open_item(kind)
            item = self._open
            index = self.output.index(item)
            item["content"][0]["text"] += ev.text
            name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            events.append(
                self.event(
                    name, item_id=item["id"], output_index=index, content_index=0, delta=ev.text, **extra
                )
            )
        elif isinstance(ev, ToolCallBegin):
            events += self._close_open()
            item = {
                "type": "function_call",
                "id": _id("fc"),
                "call_id": ev.call_id,
                "name": ev.name,
                "arguments": "",
                "status": "in_progress",
            }
            self.output.append(item)
            self._calls[ev.index] = item
            events.append(
                self.event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item))
            )
        elif isinstance(ev, ToolCallArgsDelta) and ev.index in self._calls:
            item = self._calls[ev.index]
            item["arguments"] += ev.text
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=ev.text,
                )
            )
        elif isinstance(ev, ToolCallReady) and ev.index in self._calls:
            item = self._calls[ev.index]
            item["arguments"] = ev.arguments
            item["status"] = "completed"
            index = self.output.index(item)
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=ev.arguments,
                )
            )
            events.append(self.event("response.output_item.done", output_index=index, item=dict(item)))
        elif isinstance(ev, ModelDone):
            events += self._close_open()
            # a call cut off by max_output_tokens stays in the output as incomplete
            for item in self._calls.values():
                if item["status"] != "completed":
                    item["status"] = "incomplete"
        return events

    async def count_reasoning(self, end: ModelDone) -> None:
        """Set `reasoning_tokens` from the reasoning items written (off the event loop)."""
        text = "".join(i["content"][0]["text"] for i in self.output if i["type"] == "reasoning")
        if self.tokenizer is not None:
            self.reasoning_tokens = await reasoning_tokens(self.tokenizer, text, end.usage.completion_tokens)

    def final(self, end: ModelDone) -> tuple[str, dict[str, Any]]:
        usage = {
            "input_tokens": end.usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": end.usage.cached_tokens},
            "output_tokens": end.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": end.usage.total_tokens,
        }
        if end.finish_reason == "error":
            resp = self.response("failed", usage)
            resp["error"] = {"code": "server_error", "message": f"generation failed: {end.error}"}
            return self.event("response.failed", response=resp)
        if end.finish_reason == "length":
            resp = self.response("incomplete", usage, incomplete_details={"reason": "max_output_tokens"})
            return self.event("response.incomplete", response=resp)
        return self.event("response.completed", response=self.response("completed", usage))


def _snapshot(item: dict[str, Any]) -> dict[str, Any]:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out


@router.post(
    "/v1/responses", responses=openapi.RESPONSES, openapi_extra=openapi.request_body(ResponsesRequest)
)
async def create_response(request: Request):
    body = await parse_body(request, ResponsesRequest)
    state = request.app.state.mkcode
    model = state.resolve_model(body.model)
    plan = responses_plan(body)
    turn = (await start_turn(state, plan, "input")).events()
    builder = ResponseBuilder(body, model, state.tokenizer)
    if body.stream:
        return SSEResponse(_stream(builder, turn))

    async def collect() -> ModelDone:
        async for ev in turn:
            builder.feed(ev)
            if isinstance(ev, ModelDone):
                return ev
        raise RuntimeError("generation ended without a finish event")

    end = await until_disconnect(request, collect())
    if end.finish_reason == "error":
        return error_response(500, f"generation failed: {end.error}")
    await builder.count_reasoning(end)
    return builder.final(end)[1]["response"]


async def _stream(builder: ResponseBuilder, turn) -> AsyncIterator[bytes]:
    yield sse_event(*builder.event("response.created", response=builder.response("in_progress")))
    yield sse_event(*builder.event("response.in_progress", response=builder.response("in_progress")))
    try:
        async for ev in turn:
            for kind, payload in builder.feed(ev):
                yield sse_event(kind, payload)
            if isinstance(ev, ModelDone):
                await builder.count_reasoning(ev)
                yield sse_event(*builder.final(ev))
                return
    finally:
        await turn.aclose()
