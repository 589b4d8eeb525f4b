"""A chat request (from /v1/chat/completions or /v1/responses) → one engine request.

Both endpoints reduce their body to a `ChatPlan`; `prepare` renders the prompt with the chat
template, picks the grammar that `tool_choice`/`response_format` call for, and builds the sampling
parameters (`max_tokens` clamped to the room left in the context, never refused for being large).
It runs in a worker thread: rendering and compiling schemas are CPU work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jinja2

from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.sampling import SamplingError, SamplingParams
from mkcode.backend.server.constraint import GrammarError
from mkcode.backend.server.errors import bad_request
from mkcode.backend.server.grammar import ToolSpec, TurnSpec
from mkcode.backend.server.state import ServerState

SEED_RANGE = 1 << 63


@dataclass
class ChatPlan:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)  # {"name", "description", "parameters"}
    tool_choice: str = "auto"  # none | auto | required | the name of a tool to force
    parallel: bool = True
    answer_schema: dict[str, Any] | None = None  # response_format json_object / json_schema
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@dataclass
class Prepared:
    request: GenerationRequest
    tools_enabled: bool


def sampling_params(state: ServerState, prompt_len: int, **given: Any) -> SamplingParams:
    """SamplingParams from request fields (None = not given) over the server's defaults."""
    values: dict[str, Any] = dict(state.options.default_sampling)
    values.update({k: v for k, v in given.items() if v is not None})
    room = max(1, state.max_model_len - prompt_len)
    values["max_tokens"] = min(int(values.get("max_tokens") or room), room)
    if values.get("seed") is not None:
        values["seed"] = int(values["seed"]) % SEED_RANGE
    stop = values.get("stop")
    if isinstance(stop, str):
        values["stop"] = (stop,)
    elif stop is not None:
        values["stop"] = tuple(s for s in stop)
    try:
        return SamplingParams.from_dict(values)
    except SamplingError as e:
        raise bad_request(str(e)) from None
    except TypeError as e:
        raise bad_request(f"invalid sampling parameters: {e}") from None


def _tool_specs(plan: ChatPlan) -> tuple[ToolSpec, ...]:
    specs = []
    for t in plan.tools:
        params = t.get("parameters") or {"type": "object", "properties": {}}
        specs.append(ToolSpec(t["name"], params))
    return tuple(specs)


def _turn_spec(state: ServerState, plan: ChatPlan) -> TurnSpec | None:
    """The grammar the turn needs, or None for free decoding (no tools, no response_format)."""
    tools = _tool_specs(plan)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools: tool names must be unique", param="tools")
    choice = plan.tool_choice
    if choice not in ("none", "auto", "required"):
        if choice not in names:
            raise bad_request(f"tool_choice names {choice!r}, which is not in tools", param="tool_choice")
        tools = tuple(t for t in tools if t.name == choice)
        return TurnSpec(tools, "required", False, None, state.options.forced_thinking_tokens)
    if choice == "required":
        if not tools:
            raise bad_request("tool_choice 'required' needs at least one tool", param="tool_choice")
        return TurnSpec(tools, "required", plan.parallel, None, state.options.forced_thinking_tokens)
    if not tools:
        choice = "none"
    if choice == "none" and plan.answer_schema is None:
        return TurnSpec((), "none", False, None, None) if tools else None
    budget = state.options.forced_thinking_tokens if plan.answer_schema is not None else None
    return TurnSpec(tools if choice == "auto" else (), choice, plan.parallel, plan.answer_schema, budget)


def render_prompt(state: ServerState, plan: ChatPlan) -> list[int]:
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in plan.tools
    ]
    try:
        return state.tokenizer.apply_chat_template(
            plan.messages, tools=tools or None, add_generation_prompt=True
        )
    except jinja2.exceptions.TemplateError as e:
        raise bad_request(f"messages: {e}", param="messages") from None


def prepare(state: ServerState, plan: ChatPlan) -> Prepared:
    ids = render_prompt(state, plan)
    if len(ids) >= state.max_model_len:
        raise bad_request(
            f"the prompt is {len(ids)} tokens; this server's context is {state.max_model_len} tokens "
            "(at least one must remain for the answer)",
            param="messages",
            code="context_length_exceeded",
        )
    sampling = sampling_params(
        state,
        len(ids),
        max_tokens=plan.max_tokens,
        temperature=plan.temperature,
        top_p=plan.top_p,
        top_k=plan.top_k,
        seed=plan.seed,
        stop=plan.stop or None,
    )
    spec = _turn_spec(state, plan)
    scripted = state.options.scripted_output
    script = (
        scripted({"messages": plan.messages, "tools": plan.tools, "tool_choice": plan.tool_choice})
        if scripted
        else None
    )
    if script is not None:
        constraint = state.grammars.scripted(script)
        keep = state.options.scripted_prompt_tokens
        if keep:
            ids = ids[-keep:]
    elif spec is None:
        constraint = None
    else:
        try:
            constraint = state.grammars.for_turn(spec, lenient_tools=spec.mode == "auto")
        except GrammarError as e:
            param = (
                "response_format" if plan.answer_schema is not None and spec.mode != "required" else "tools"
            )
            raise bad_request(f"cannot compile the JSON Schema into a grammar: {e}", param=param) from None
    return Prepared(GenerationRequest(ids, sampling, constraint=constraint), tools_enabled=bool(plan.tools))
