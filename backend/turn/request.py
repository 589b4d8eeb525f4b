"""What one chat turn asks for (`TurnRequest`), the pipeline's settings (`TurnOptions`), and the
error a request that cannot be run raises (`TurnRequestError`, a 400 for the server)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TurnRequest:
    """One chat turn. `tools` are flat function specs: {"name", "description", "parameters"}."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str = "auto"  # none | auto | required | the name of a tool to force
    parallel: bool = True
    answer_schema: dict[str, Any] | None = None  # response_format json_object / json_schema
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TurnOptions:
    # Sampling defaults for fields a request leaves out (e.g. from the checkpoint's generation_config).
    default_sampling: Mapping[str, Any] = field(default_factory=dict)
    # Upper bound on the thinking block when a tool call is forced (tool_choice required/named) or
    # structured output is asked for: the answer must come, so the plan cannot run forever. A forced
    # call gets less when max_tokens is too small for both (see prepare.forced_budget).
    forced_thinking_tokens: int = 1024
    # Constrain tool calls (and response_format) with the grammar; False decodes freely.
    grammar: bool = True


class TurnRequestError(ValueError):
    """The request cannot be run as given; `param` names the field at fault, `code` is OpenAI's."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def flat_tools(openai_tools: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shaped tools ({"type": "function", "function": {...}}) → flat function specs."""
    out = []
    for t in openai_tools:
        fn = t.get("function", t)
        out.append({k: fn[k] for k in ("name", "description", "parameters") if k in fn})
    return out


def openai_tools(tools: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Flat function specs → the OpenAI shape the chat template reads."""
    return [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in tools
    ]
