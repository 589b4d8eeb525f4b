"""Grammars (llguidance's Lark dialect) for what a cmd4 chatbot turn may contain.

A cmd4 turn is an optional `<|START_THINKING|>plan<|END_THINKING|>` followed by either an answer
(`<|START_TEXT|>…<|END_TEXT|>` or `<|START_RESPONSE|>…<|END_RESPONSE|>`) or an action block, written
exactly as the chat template renders past calls (so the model sees its own format and
`Cmd4StreamParser` reads it back):

    <|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "read", "parameters": {…}}
    ]<|END_ACTION|>

The `parameters` object of each call is generated under that tool's JSON Schema, with the
template's separators (", " and ": ") and no free whitespace. Control tokens are referenced as
special tokens, so free text can never contain one; free text may not contain the two characters
"<|" either, so the parser (which reads decoded text) cannot mistake plain text for a marker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ToolMode = Literal["none", "auto", "required"]

# The JSON compiler options every schema is compiled with (the template's own formatting).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
# Text that contains no "<|" (see module doc): runs of '<' must be followed by neither '<' nor '|'.
FREE_TEXT = r"/([^<]|<+[^<|])*<*/"
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class TurnSpec:
    """What the turn may contain. `tools` empty with mode "none" and no schema means free text."""

    tools: tuple[ToolSpec, ...] = ()
    mode: ToolMode = "none"
    parallel: bool = True
    answer_schema: dict[str, Any] | None = None  # response_format: the answer is JSON under it
    thinking_tokens: int | None = None  # bound on the plan, when the turn must reach its point (0: none)
    max_calls: int | None = None  # bound on the calls of a parallel action (None: any number)


def with_json_options(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with mkcode's compiler options (a schema's own x-guidance keys win)."""
    own = schema.get("x-guidance") if isinstance(schema.get("x-guidance"), dict) else {}
    return {**schema, "x-guidance": {**JSON_OPTIONS, **own}}


def _lit(text: str) -> str:
    """A Lark string literal matching `text` exactly."""
    return json.dumps(text, ensure_ascii=False)


def _json_rule(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(with_json_options(schema), ensure_ascii=False)


def turn_grammar(spec: TurnSpec) -> str:
    """The Lark grammar of one turn under `spec`."""
    lines = ["%llguidance {}"]
    can_answer = spec.mode != "required"
    can_act = spec.mode != "none" and bool(spec.tools)
    if not can_answer and not can_act:
        raise ValueError("a turn must allow an answer or a tool call")
    body = " | ".join(x for x, ok in (("answer", can_answer), ("action", can_act)) if ok)
    if spec.thinking_tokens == 0:
        lines.append(f"start: {body}")
    else:
        lines.append(f"start: think? ({body})")
        lines.append("think: <|START_THINKING|> think_text <|END_THINKING|>")
        budget = f"[max_tokens={spec.thinking_tokens}]" if spec.thinking_tokens else ""
        lines.append(f"think_text{budget}: {FREE_TEXT}")
    if can_answer:
        lines.append(
            "answer: <|START_TEXT|> answer_body <|END_TEXT|> | <|START_RESPONSE|> answer_body <|END_RESPONSE|>"
        )
        if spec.answer_schema is not None:
            lines.append(f"answer_body: {_json_rule(spec.answer_schema)}")
        else:
            lines.append(f"answer_body: {FREE_TEXT}")
    if can_act:
        more = ""
        if spec.parallel and spec.max_calls is None:
            more = ' ("," "\\n" call)*'
        elif spec.parallel:
            for _ in range(max(0, spec.max_calls - 1)):
                more = f' ("," "\\n" call{more})?'
        lines.append(f'action: <|START_ACTION|> "[\\n" call{more} "\\n]" <|END_ACTION|>')
        lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(spec.tools))))
        lines.append("call_id: /[0-9]{1,4}/")
        for i, tool in enumerate(spec.tools):
            head = _lit('    {"tool_call_id": "')
            mid = _lit('", "tool_name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "parameters": ')
            lines.append(f'call_{i}: {head} call_id {mid} args_{i} "}}"')
            lines.append(f"args_{i}: {_json_rule(tool.parameters)}")
    return "\n".join(lines) + "\n"


def json_answer_grammar(schema: dict[str, Any]) -> str:
    """Plain JSON under `schema` (no chat markers): for completions-style output."""
    return f"%llguidance {{}}\nstart: {_json_rule(schema)}\n"


# Bytes one character of a JSON string can take (a `\uXXXX` escape); every token is at least one byte,
# so a string of n characters costs at most JSON_CHAR_TOKENS * n tokens.
JSON_CHAR_TOKENS = 6
# Items an unbounded array may hold when a forced call's arguments must fit a token budget.
BOUNDED_ARRAY_ITEMS = 4
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def _has_type(node: dict[str, Any], name: str) -> bool:
    t = node.get("type")
    return t == name or (isinstance(t, list) and name in t)


def _walk_schema(node: Any, visit: Any) -> Any:
    """A copy of the schema with `visit` applied to every subschema (dicts), children first."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_walk_schema(v, visit) for v in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _walk_schema(v, visit) for k, v in out[key].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = _walk_schema(out[key], visit)
    return visit(out)


def string_slots(schema: dict[str, Any]) -> tuple[int, int]:
    """(strings, key bytes) an instance of `schema` can hold once arrays are bounded: the number of
    string values (an array counts its items `BOUNDED_ARRAY_ITEMS` times at most) and the bytes of the
    property names, quotes and separators (an upper bound on the object skeleton's tokens)."""

    def count(node: Any) -> tuple[int, int]:
        if not isinstance(node, dict):
            return 0, 0
        strings = 1 if _has_type(node, "string") and "enum" not in node and "const" not in node else 0
        keys = 2
        for name, sub in (node.get("properties") or {}).items():
            s, k = count(sub)
            strings, keys = strings + s, keys + k + len(json.dumps(name, ensure_ascii=False)) + 4
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key]:
                s, k = max(count(v) for v in node[key])
                strings, keys = strings + s, keys + k
        if isinstance(node.get("items"), dict):
            items = min(int(node.get("maxItems", BOUNDED_ARRAY_ITEMS)), BOUNDED_ARRAY_ITEMS)
            s, k = count(node["items"])
            strings, keys = strings + items * s, keys + items * (k + 2)
        return strings, keys

    return count(schema)


def bounded_schema(schema: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """`schema` with every free string at most `max_chars` characters, every array at most
    `BOUNDED_ARRAY_ITEMS` items and objects limited to their declared properties (tighter bounds
    the schema already has are kept). Not bounded: numbers, and objects whose `additionalProperties`
    is itself a schema."""

    def visit(node: dict[str, Any]) -> dict[str, Any]:
        if _has_type(node, "string") and "enum" not in node and "const" not in node:
            node["maxLength"] = min(int(node.get("maxLength", max_chars)), max_chars)
            node["minLength"] = min(int(node.get("minLength", 0)), node["maxLength"])
        if _has_type(node, "array"):
            node["maxItems"] = min(int(node.get("maxItems", BOUNDED_ARRAY_ITEMS)), BOUNDED_ARRAY_ITEMS)
            node["minItems"] = min(int(node.get("minItems", 0)), node["maxItems"])
        if _has_type(node, "object") and node.get("additionalProperties", True) is True:
            node["additionalProperties"] = False  # only the declared properties: a bounded count
        return node

    return _walk_schema(schema, visit)
