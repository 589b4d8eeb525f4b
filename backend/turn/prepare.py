"""A `TurnRequest` → one engine request: the prompt's ids, the sampling parameters and the grammar.

`prepare` renders the prompt (through the `PromptEncoder`: incremental), refuses one that leaves no
room in the context, clamps `max_tokens` to the room left (never refused for being large), picks the
grammar that `tool_choice` / `response_format` call for and compiles it. CPU work: the pipeline runs
it in a worker thread.

A forced call (tool_choice `required` or a named tool) must arrive whatever `max_tokens` is, so its
grammar is sized to it (`forced_budget`): the thinking block gets at most a quarter of the tokens the
call's fixed text leaves, and every free string of the arguments is bounded so that even written
with the costliest characters the call closes within the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jinja2

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.sampling import SamplingError, SamplingParams
from mkcode.backend.turn.constraint import GrammarConstraints, GrammarError
from mkcode.backend.turn.grammar import (
    JSON_CHAR_TOKENS,
    ToolSpec,
    TurnSpec,
    bounded_schema,
    string_slots,
)
from mkcode.backend.turn.prompt import PromptEncoder
from mkcode.backend.turn.request import TurnOptions, TurnRequest, TurnRequestError, openai_tools

SEED_RANGE = 1 << 63
# Calls a forced parallel action may hold: each gets an equal share of the argument budget.
FORCED_PARALLEL_CALLS = 2
MIN_CALL_ARGS = 64


@dataclass
class Prepared:
    request: GenerationRequest
    tools_enabled: bool
    spec: TurnSpec | None = None


def sampling_params(
    options: TurnOptions, max_model_len: int, prompt_len: int, **given: Any
) -> SamplingParams:
    """SamplingParams from request fields (None = not given) over the defaults; `max_tokens` is
    clamped to the room the prompt leaves."""
    values: dict[str, Any] = dict(options.default_sampling)
    values.update({k: v for k, v in given.items() if v is not None})
    room = max(1, max_model_len - prompt_len)
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
        raise TurnRequestError(str(e)) from None
    except TypeError as e:
        raise TurnRequestError(f"invalid sampling parameters: {e}") from None


def _tool_specs(request: TurnRequest) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(t["name"], t.get("parameters") or {"type": "object", "properties": {}})
        for t in request.tools
    )


def worst_case_tokens(text: str) -> int:
    """The most tokens `text` can take under the grammar: one per control token, and one per byte of
    the rest (the grammar allows every tokenisation of its fixed text, and a token is at least a
    byte; a trained model takes the canonical, shorter one)."""
    markers = [m for m in st.SPECIAL_TOKENS if m in text]
    count = 0
    for m in markers:
        count += text.count(m)
        text = text.replace(m, "")
    return count + len(text.encode("utf-8"))


def call_overhead(names: list[str]) -> tuple[int, int]:
    """Worst-case tokens of a forced turn's fixed text: (the turn's: empty thinking, the action
    block's markers, the end of the turn; one call's, with the longest tool name)."""
    name = json.dumps(max(names, key=len), ensure_ascii=False)
    turn = st.START_THINKING + st.END_THINKING + st.START_ACTION + "[\n\n]" + st.END_ACTION + st.END_OF_TURN
    call = ',\n    {"tool_call_id": "0000", "tool_name": ' + name + ', "parameters": }'
    return worst_case_tokens(turn), worst_case_tokens(call)


def forced_budget(
    max_tokens: int, overhead: tuple[int, int], thinking_cap: int, tools: tuple[ToolSpec, ...], parallel: bool
) -> tuple[int, int, tuple[ToolSpec, ...]]:
    """(thinking tokens, calls, tools with bounded arguments) for a forced call within `max_tokens`:
    the plan gets at most a quarter of what one call with `MIN_CALL_ARGS` tokens of arguments leaves;
    a parallel action holds
    `FORCED_PARALLEL_CALLS` calls when each still gets `MIN_CALL_ARGS` tokens of arguments, else one;
    each call's free strings share its argument tokens at the worst case of `JSON_CHAR_TOKENS`."""
    turn_cost, call_cost = overhead
    room = max(0, max_tokens - turn_cost)
    thinking = min(thinking_cap, max(0, room - call_cost - MIN_CALL_ARGS) // 4)
    left = room - thinking
    calls = 1
    if parallel and left >= FORCED_PARALLEL_CALLS * (call_cost + MIN_CALL_ARGS):
        calls = FORCED_PARALLEL_CALLS
    per_call = left // calls - call_cost
    bounded = []
    for tool in tools:
        strings, skeleton = string_slots(tool.parameters)
        chars = max(1, (per_call - skeleton) // (JSON_CHAR_TOKENS * max(1, strings)))
        bounded.append(ToolSpec(tool.name, bounded_schema(tool.parameters, chars)))
    return thinking, calls, tuple(bounded)


def turn_spec(options: TurnOptions, request: TurnRequest, max_tokens: int) -> TurnSpec | None:
    """The grammar the turn needs, or None for free decoding (no tools, no response_format)."""
    tools = _tool_specs(request)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise TurnRequestError("tools: tool names must be unique", param="tools")
    choice = request.tool_choice
    if choice not in ("none", "auto", "required"):
        if choice not in names:
            raise TurnRequestError(
                f"tool_choice names {choice!r}, which is not in tools", param="tool_choice"
            )
        tools = tuple(t for t in tools if t.name == choice)
    elif choice == "required" and not tools:
        raise TurnRequestError("tool_choice 'required' needs at least one tool", param="tool_choice")
    if choice not in ("none", "auto"):
        parallel = request.parallel and choice == "required"
        overhead = call_overhead([t.name for t in tools])
        thinking, calls, bounded = forced_budget(
            max_tokens, overhead, options.forced_thinking_tokens, tools, parallel
        )
        return TurnSpec(bounded, "required", calls > 1, None, thinking, calls if calls > 1 else None)
    if not tools:
        choice = "none"
    if choice == "none" and request.answer_schema is None:
        return TurnSpec((), "none", False, None, None) if tools else None
    budget = options.forced_thinking_tokens if request.answer_schema is not None else None
    return TurnSpec(
        tools if choice == "auto" else (), choice, request.parallel, request.answer_schema, budget
    )


def render_prompt(encoder: PromptEncoder, request: TurnRequest) -> list[int]:
    try:
        return encoder.encode(request.messages, openai_tools(request.tools) or None)
    except jinja2.exceptions.TemplateError as e:
        raise TurnRequestError(f"messages: {e}", param="messages") from None


def prepare(
    options: TurnOptions,
    encoder: PromptEncoder,
    grammars: GrammarConstraints,
    max_model_len: int,
    request: TurnRequest,
) -> Prepared:
    ids = render_prompt(encoder, request)
    if len(ids) >= max_model_len:
        raise TurnRequestError(
            f"the prompt is {len(ids)} tokens; the model's context is {max_model_len} tokens "
            "(at least one must remain for the answer)",
            param="messages",
            code="context_length_exceeded",
        )
    sampling = sampling_params(
        options,
        max_model_len,
        len(ids),
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=request.seed,
        stop=request.stop or None,
    )
    spec = turn_spec(options, request, sampling.max_tokens)
    constraint = None
    if spec is not None and options.grammar:
        try:
            constraint = grammars.for_turn(spec, lenient_tools=spec.mode == "auto")
        except GrammarError as e:
            param = (
                "response_format"
                if request.answer_schema is not None and spec.mode != "required"
                else "tools"
            )
            raise TurnRequestError(
                f"cannot compile the JSON Schema into a grammar: {e}", param=param
            ) from None
    return Prepared(
        GenerationRequest(ids, sampling, constraint=constraint), tools_enabled=bool(request.tools), spec=spec
    )
