"""Checking a tool call's arguments before the tool sees them.

A call's arguments come from the model (or `mkcode tool --args`), so they are hostile input. They
are accepted only when they are a JSON object that
  - parses as strict JSON: no NaN / Infinity literals (Python's json accepts them), no number that
    overflows to infinity (`1e999`), nothing nested deeper than MAX_DEPTH, at most MAX_JSON_CHARS;
  - holds only finite numbers, at any depth (JSON Schema cannot say this: NaN compares false with
    every bound, so `{"timeout": NaN}` passes `exclusiveMinimum`, `maximum` and every range check),
    and only strings that are valid Unicode (no lone surrogates: they cannot become a path or a file);
  - validates against the tool's JSON schema (types, required, enums, lengths, sizes, ranges,
    no unknown properties where the schema closes the object).
Every refusal is a short message naming the argument and the rule; never a value, never a trace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

MAX_JSON_CHARS = 64 * 1024 * 1024  # the raw argument text of one call
MAX_DEPTH = 32  # objects and arrays nested inside one another
_SHOWN_CHARS = 80  # how much of an enum value or property name an error message quotes
_MESSAGE_CHARS = 160  # a longer jsonschema message (it quotes the value) is replaced by a short one


class ArgumentError(ValueError):
    """The arguments of a tool call were refused; str(e) is the message for the model."""


def _refuse_constant(name: str) -> Any:
    raise ArgumentError(f"{name} is not a JSON number; give a finite number")


def parse_arguments(text: str) -> Any:
    """Strict JSON: NaN, Infinity and -Infinity refused, size and depth bounded."""
    if len(text) > MAX_JSON_CHARS:
        raise ArgumentError(f"arguments are {len(text)} characters, over the {MAX_JSON_CHARS} limit")
    if not text.strip():
        return {}
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ArgumentError:
        raise
    except json.JSONDecodeError as e:
        raise ArgumentError(
            f"arguments are not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:  # the C scanner's own depth guard, for '[[[[...'
        raise ArgumentError(f"arguments are nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ArgumentError(f"arguments are not acceptable JSON: {_short(str(e))}") from None
    check_finite(value)
    return value


def check_finite(value: Any) -> None:
    """Raise ArgumentError for a NaN or infinite number, a string that is not valid Unicode (a lone
    surrogate, which json.loads accepts from a \\ud800 escape), or nesting past MAX_DEPTH, anywhere."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        name = where or "the arguments"
        if isinstance(item, float) and not math.isfinite(item):
            raise ArgumentError(f"{name}: {item!r} is not a finite number; give a finite number")
        if isinstance(item, str) and not _is_unicode(item):
            raise ArgumentError(f"{name}: the string holds a lone surrogate (not valid Unicode)")
        if isinstance(item, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise ArgumentError(f"arguments are nested more than {MAX_DEPTH} levels deep")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and not _is_unicode(key):
                    raise ArgumentError(
                        f"{name}: an argument name holds a lone surrogate (not valid Unicode)"
                    )
                label = _short(str(key))
                stack.append((child, f"{where}.{label}" if where else label, depth + 1))


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> Any:
    from jsonschema import Draft202012Validator  # imported on first use: keeps CLI start fast

    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _describe(err: Any) -> str:
    """One rule broken: jsonschema's own message when short, else said without echoing the value."""
    if len(err.message) <= _MESSAGE_CHARS:
        return str(err.message)
    rule, bound = err.validator, err.validator_value
    value = err.instance
    messages = {
        "maxLength": lambda: f"is {len(value)} characters long, over the {bound} limit",
        "minLength": lambda: "must not be empty" if bound == 1 else f"is shorter than {bound} characters",
        "maxItems": lambda: f"has {len(value)} items, over the {bound} limit",
        "minItems": lambda: f"has fewer than {bound} items",
        "maxProperties": lambda: f"has more than {bound} properties",
        "maximum": lambda: f"must be at most {_num(bound)}",
        "minimum": lambda: f"must be at least {_num(bound)}",
        "exclusiveMaximum": lambda: f"must be less than {_num(bound)}",
        "exclusiveMinimum": lambda: f"must be greater than {_num(bound)}",
        "multipleOf": lambda: f"must be a multiple of {bound}",
        "type": lambda: f"must be of type {bound}, not {_json_type(value)}",
        "enum": lambda: "must be one of " + ", ".join(_short(json.dumps(v)) for v in bound),
        "const": lambda: f"must be {_short(json.dumps(bound))}",
        "pattern": lambda: f"does not match the pattern {_short(str(bound))}",
        "uniqueItems": lambda: "must not repeat items",
    }
    if rule in messages:
        return messages[rule]()
    if rule == "required":
        missing = [p for p in bound if isinstance(value, dict) and p not in value]
        return "missing required argument " + ", ".join(repr(p) for p in missing)
    if rule == "additionalProperties" and isinstance(value, dict):
        known = set(err.schema.get("properties", {}))
        extra = sorted(_short(str(k)) for k in value if k not in known)
        return (
            "unknown argument " + ", ".join(repr(k) for k in extra[:5]) + (" ..." if len(extra) > 5 else "")
        )
    return _short(err.message)


def _num(bound: Any) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def schema_errors(schema: Mapping[str, Any], args: Any) -> list[str]:
    """Every way `args` breaks `schema`, one short message each ("timeout: must be at most 600")."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    messages: list[str] = []
    for err in sorted(validator.iter_errors(args), key=lambda e: [str(p) for p in e.absolute_path]):
        where = ".".join(_short(str(p)) for p in err.absolute_path)
        text = _describe(err)
        messages.append(f"{where}: {text}" if where else text)
    return messages


def _coerce_integers(schema: Mapping[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """An "integer" argument given as 3.0 becomes 3 (JSON Schema counts 3.0 as an integer)."""
    props = schema.get("properties", {})
    out = dict(args)
    for name, value in args.items():
        if props.get(name, {}).get("type") == "integer" and isinstance(value, float):
            out[name] = int(value)
    return out


def validate_arguments(schema: Mapping[str, Any], args: Any) -> dict[str, Any]:
    """The arguments, checked: a dict the tool may trust to match its schema. Raises ArgumentError."""
    if isinstance(args, str):
        args = parse_arguments(args)
    elif args is None:
        args = {}
    else:
        check_finite(args)
    if not isinstance(args, dict):
        raise ArgumentError(f"arguments must be a JSON object, not {_json_type(args)}")
    try:
        errors = schema_errors(schema, args)
    except RecursionError:
        raise ArgumentError(f"arguments are nested more than {MAX_DEPTH} levels deep") from None
    if errors:
        raise ArgumentError("; ".join(errors))
    return _coerce_integers(schema, args)
