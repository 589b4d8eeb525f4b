"""Hypothesis strategies for OpenAI-shaped conversations, tools and JSON values."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as hs

from mkcode.backend.chat import special_tokens as st

# Rust strings cannot hold lone surrogates, so Melody never sees them; everything else is fair game.
_chars = hs.characters(blacklist_categories=("Cs",))
_plain_text = hs.text(_chars, max_size=24)
text = hs.one_of(
    _plain_text,
    hs.lists(
        hs.one_of(
            _plain_text, hs.sampled_from([*st.SPECIAL_TOKENS, "{{ x }}", "{% raw %}", '"', "\\", "\n"])
        ),
        max_size=5,
    ).map("".join),
)

# Floats Melody and Python print alike: finite, no exponent (Rust writes 1e20 where Python writes 1e+20)
# and at most 15 significant digits below 1e15 (Melody misrounds ~10 % of 17-digit values and some
# larger ones by an ulp; Python's repr round-trips exactly, so those differences are Melody's).
_floats = (
    hs.floats(
        min_value=-1e15,
        max_value=1e15,
        allow_nan=False,
        allow_infinity=False,
        exclude_min=True,
        exclude_max=True,
    )
    .map(lambda x: float(f"{x:.15g}"))
    .filter(lambda x: "e" not in repr(x))
)


def json_objects_of(strings: hs.SearchStrategy[str]) -> hs.SearchStrategy[dict[str, Any]]:
    """JSON objects whose keys and string values come from ``strings``."""
    scalars = hs.one_of(hs.none(), hs.booleans(), hs.integers(-(2**63), 2**63 - 1), _floats, strings)
    values = hs.recursive(
        scalars,
        lambda children: hs.one_of(
            hs.lists(children, max_size=3), hs.dictionaries(strings, children, max_size=3)
        ),
        max_leaves=8,
    )
    return hs.dictionaries(strings, values, max_size=4)


json_objects = json_objects_of(text)
#: Text a model can write inside a JSON string without it reading as a control token.
marker_free_text = _plain_text.filter(lambda s: "<|" not in s and not any(t in s for t in st.SPECIAL_TOKENS))


def _content(draw: hs.DrawFn, allow_none: bool = True) -> Any:
    kind = draw(hs.sampled_from(["str", "parts", "none"] if allow_none else ["str", "parts"]))
    if kind == "str":
        return draw(text)
    if kind == "parts":
        return [{"type": "text", "text": t} for t in draw(hs.lists(text, max_size=3))]
    return None


@hs.composite
def tools(draw: hs.DrawFn) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(hs.integers(0, 3))):
        fn: dict[str, Any] = {"name": draw(text)}
        if draw(hs.booleans()):
            fn["description"] = draw(text)
        if draw(hs.booleans()):
            fn["parameters"] = {
                "type": "object",
                "properties": draw(hs.dictionaries(text, json_objects, max_size=3)),
            }
        out.append({"type": "function", "function": fn})
    return out


@hs.composite
def conversations(draw: hs.DrawFn, string_arguments: bool = True) -> list[dict[str, Any]]:
    """A valid conversation: system runs, user turns, assistant text or tool calls answered by tool turns."""
    messages: list[dict[str, Any]] = []
    ids = iter(range(10_000))
    id_prefix = draw(hs.sampled_from(["call_", "", "é-"]))
    for _ in range(draw(hs.integers(0, 2))):
        messages.append({"role": draw(hs.sampled_from(["system", "developer"])), "content": _content(draw)})
    for _ in range(draw(hs.integers(0, 3))):
        kind = draw(hs.sampled_from(["user", "system", "assistant", "tools"]))
        if kind == "user":
            messages.append({"role": "user", "content": _content(draw)})
        elif kind == "system":
            messages.append({"role": "system", "content": _content(draw)})
        elif kind == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": _content(draw)}
            if draw(hs.booleans()):
                msg[draw(hs.sampled_from(["reasoning", "reasoning_content", "thinking"]))] = draw(text)
            messages.append(msg)
        else:
            calls = []
            for _ in range(draw(hs.integers(1, 3))):
                args: Any = draw(json_objects)
                if string_arguments and draw(hs.booleans()):
                    args = json.dumps(args, ensure_ascii=draw(hs.booleans()), separators=(",", ":"))
                calls.append(
                    {
                        "id": f"{id_prefix}{next(ids)}",
                        "type": "function",
                        "function": {"name": draw(text), "arguments": args},
                    }
                )
            msg = {"role": "assistant", "content": _content(draw), "tool_calls": calls}
            if draw(hs.booleans()):
                msg["reasoning"] = draw(text)
            messages.append(msg)
            for call in draw(hs.permutations(calls)):
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": _content(draw)})
    return messages
