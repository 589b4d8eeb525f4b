"""Request bodies of the OpenAI-compatible endpoints, validated with pydantic.

Unknown fields are accepted and ignored (clients send `store`, `metadata`, `user`, `verbosity`,
…); fields whose values are wrong are a 400 naming the field. Fields the server cannot honour
(`n` > 1, `logprobs`) are refused by the handlers with a message that says so.

Before any field is looked at, the whole body passes `check_json` (`_Request`'s before-validator):
nesting at most `MAX_JSON_DEPTH`, finite numbers only (Python's JSON parser accepts `Infinity` and
`NaN`, which nothing downstream can serialise), integers within 64 bits (what llguidance, the
sampler's seed and the tokenizer ids take). A JSON Schema the server compiles (tool `parameters`,
`response_format`) is also capped at `MAX_SCHEMA_NODES` values. So the renderer and the grammar
compiler only ever see bounded, finite input, and a bad body is a 400 naming the path at fault.

The endpoints read their bodies through `parse_body`, which parses and validates in a worker
thread: nothing proportional to the body's size runs on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Literal, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError
from starlette.requests import Request

MAX_JSON_DEPTH = 64  # nesting of a whole request body (a real tool schema nests a dozen levels)
MAX_SCHEMA_NODES = 20_000  # JSON values in one tool's parameters or one response_format schema
MAX_TOOLS = 512
MAX_STOP = 64  # stop strings per request (OpenAI allows 4; agents send a few)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _path(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def _within_limits(value: Any, max_nodes: int | None) -> bool:
    """The fast pass of `check_json`: True when nothing is wrong (no paths kept, no allocation per
    scalar; a million-item list takes tens of milliseconds)."""
    t = type(value)
    if t is not dict and t is not list:
        return _scalar_ok(value)
    nodes = 1
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth >= MAX_JSON_DEPTH:
            return False
        items = v.values() if type(v) is dict else v
        nodes += len(items)
        if max_nodes is not None and nodes > max_nodes:
            return False
        for x in items:
            t = type(x)
            if t is dict or t is list:
                stack.append((x, depth + 1))
            elif t is float:
                if not math.isfinite(x):
                    return False
            elif t is int:
                if x > INT64_MAX or x < INT64_MIN:
                    return False
            elif t is not str and t is not bool and x is not None and not _scalar_ok(x):
                return False
    return True


def _scalar_ok(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return INT64_MIN <= v <= INT64_MAX
    return True


def check_json(value: Any, where: list[str | int] | None = None, *, max_nodes: int | None = None) -> None:
    """Raise ValueError naming the first place where `value` (parsed JSON) nests deeper than
    MAX_JSON_DEPTH, holds a non-finite number or an integer outside 64 bits, or (with `max_nodes`)
    holds more values than that. Iterative: any depth is safe to check."""
    if _within_limits(value, max_nodes):
        return
    base = list(where or [])
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 0, ())]
    nodes = 0
    while stack:
        v, depth, rel = stack.pop()
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            raise ValueError(f"{_path(base)}: a JSON Schema of more than {max_nodes} values is not accepted")
        if isinstance(v, dict):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"{_path(base + list(rel))}: nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((item, depth + 1, (*rel, str(k))) for k, item in v.items())
        elif isinstance(v, list):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"{_path(base + list(rel))}: nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((item, depth + 1, (*rel, i)) for i, item in enumerate(v))
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{_path(base + list(rel))}: {v} is not a JSON number (must be finite)")
        elif isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
            raise ValueError(f"{_path(base + list(rel))}: integer {v} does not fit in 64 bits")


def _edge_checked(data: Any) -> Any:
    try:
        check_json(data)
    except ValueError as e:
        raise PydanticCustomError("json_limits", str(e)) from None
    return data


def _schema_checked(value: Any) -> Any:
    if value is not None:
        try:
            check_json(value, max_nodes=MAX_SCHEMA_NODES)
        except ValueError as e:
            raise PydanticCustomError("schema_too_large", str(e)) from None
    return value


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Request(_Open):
    """A request body: the whole JSON is bounded (`check_json`) before any field is validated."""

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        return _edge_checked(data)


class FunctionDef(_Open):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _bounded_schema(cls, v: Any) -> Any:
        return _schema_checked(v)


class ChatTool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Open):
    include_usage: bool = False


class JsonSchemaFormat(_Open):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    @field_validator("schema_")
    @classmethod
    def _bounded_schema(cls, v: Any) -> Any:
        return _schema_checked(v)


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ToolCallFunction(_Open):
    name: str
    arguments: str | dict[str, Any] | None = None


class MessageToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any] | str] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class SamplingFields(_Request):
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = Field(default=None, max_length=MAX_STOP)
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None


class ChatCompletionRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class CompletionRequest(SamplingFields):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = Field(default=None, ge=1)


class ResponsesTool(_Open):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _bounded_schema(cls, v: Any) -> Any:
        return _schema_checked(v)


class ResponsesNamedChoice(_Open):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(_Open):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _bounded_schema(cls, v: Any) -> Any:
        return _schema_checked(v)


class ResponsesText(_Open):
    format: ResponsesTextFormat | None = None


class ResponsesRequest(_Request):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stream: bool = False
    text: ResponsesText | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None


M = TypeVar("M", bound=BaseModel)


def _parse(raw: bytes, model: type[M]) -> M:
    try:
        data = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        pos = getattr(e, "pos", 0)
        error = {"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": getattr(e, "msg", str(e))}}]) from None
    except RecursionError:
        error = {"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": "nested too deeply"}}]) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False, include_context=False)) from None


async def parse_body(request: Request, model: type[M]) -> M:
    """The request's JSON body as `model`, parsed and validated in a worker thread (a body of many
    megabytes costs the event loop nothing); errors are the same 400s as FastAPI's own parsing."""
    return await asyncio.to_thread(_parse, await request.body(), model)


REQUEST_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionRequest, CompletionRequest, ResponsesRequest)
