"""What /openapi.json says each endpoint answers: the response bodies (documentation models, never
used to build a response) and the error body every 4xx/5xx carries.

A schema-driven fuzzer (schemathesis, in tests/backend/server/test_schemathesis.py) checks every
answer against these, so they state what clients rely on: the required fields and their types.
Streaming answers are documented as `text/event-stream`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from mkcode.backend.server.schemas import REQUEST_MODELS

_REF = "#/components/schemas/{model}"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Doc):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(_Doc):
    error: ErrorDetail


class Usage(_Doc):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ToolCallFunction(_Doc):
    name: str
    arguments: str


class ToolCall(_Doc):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class AssistantMessage(_Doc):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Doc):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]


class ChatCompletion(_Doc):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(_Doc):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]


class Completion(_Doc):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ResponsesUsage(_Doc):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    output_tokens_details: dict[str, int]


class Response(_Doc):
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed"]
    model: str
    output: list[dict[str, Any]]
    usage: ResponsesUsage


class ModelCard(_Doc):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Doc):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Doc):
    status: str
    model: str


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody, "description": "an OpenAI-shaped error"} for s in statuses}


# One server-sent event, as an SSE parser reads it (`data` is a JSON text, or `[DONE]`).
_SSE_EVENT = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}
_EVENT_STREAM = {"text/event-stream": {"schema": _SSE_EVENT}}
_COMMON = (401, 413, 500)  # the key check, the body limit, the catch-all
_POSTS = _errors(400, 404, *_COMMON)

CHAT: dict[int | str, dict[str, Any]] = {
    200: {"model": ChatCompletion, "content": _EVENT_STREAM, "description": "a completion or its SSE stream"},
    **_POSTS,
}
COMPLETIONS: dict[int | str, dict[str, Any]] = {
    200: {"model": Completion, "content": _EVENT_STREAM, "description": "a completion or its SSE stream"},
    **_POSTS,
}
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Response, "content": _EVENT_STREAM, "description": "a response or its SSE events"},
    **_POSTS,
}
MODELS: dict[int | str, dict[str, Any]] = {200: {"model": ModelList}, **_errors(*_COMMON)}
MODEL: dict[int | str, dict[str, Any]] = {200: {"model": ModelCard}, **_errors(404, *_COMMON)}
HEALTH: dict[int | str, dict[str, Any]] = {
    200: {"model": Health},
    503: {"model": Health, "description": "the engine thread has stopped"},
    **_errors(500),
}
METRICS: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
    **_errors(*_COMMON),
}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of an endpoint that reads its body with `schemas.parse_body` (off the event
    loop, so FastAPI does not see the body parameter): the documented request body."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install(app: FastAPI) -> None:
    """Serve the schema with the request models (`request_body`) and without FastAPI's 422 answers:
    this server answers a bad body with a 400."""

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            for path in doc.get("paths", {}).values():
                for op in path.values():
                    op.get("responses", {}).pop("422", None)
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            _, defs = models_json_schema([(m, "validation") for m in REQUEST_MODELS], ref_template=_REF)
            components.update(defs.get("$defs", {}))
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]
