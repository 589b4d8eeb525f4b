"""Convert OpenAI-shaped messages and tools into a ``cohere_melody.render_cmd4`` config.

Melody's renderer is the ground truth of the cmd4 prompt format; this converter is how mkcode's own chat
template is checked against it (``render_cmd4(to_melody_config(m, t)) == render_chat(chat_template(), m,
t)``). It encodes the mapping decisions, which the template mirrors:

- ``developer`` is a ``system`` message. A run of consecutive system messages is merged into one system
  turn, their texts joined by a blank line (``"\\n\\n"``). Melody renders each system message as its own
  turn and concatenates a message's text parts with no separator, so merging happens here, before it.
- Text content (a string, or a list of ``{"type": "text", "text": ...}`` parts, concatenated) becomes one
  text part; ``None`` or a list without text parts becomes no part (an empty turn).
- An assistant message with tool calls renders its reasoning as the cmd4 "thinking" plan, or its
  content when it has no reasoning (cmd4 has no free text beside an action). Without tool calls, it
  renders reasoning (possibly empty) as thinking and content (possibly empty) as text.
- Tool-call ``arguments`` (JSON strings, or objects) become Melody's ``parameters`` JSON string; an
  empty string means ``{}``. Melody re-serialises them; tool-call ids become "0", "1", ... by first
  appearance.
- A tool message's text content is a result list: a string is one result, each text part one result.
- ``grounding`` is always set explicitly (Melody's default, when absent, is enabled).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["message_text", "to_melody_config"]

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _is_text_part(part: Any) -> bool:
    return isinstance(part, str) or (isinstance(part, Mapping) and part.get("type", "text") == "text")


def _part_text(part: Any) -> str:
    return part if isinstance(part, str) else str(part.get("text", ""))


def message_text(content: Any) -> str | None:
    """The text of an OpenAI message ``content``: a string as is, text parts concatenated, else None."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, Mapping):
        parts = [p for p in content if _is_text_part(p)]
        if parts:
            return "".join(_part_text(p) for p in parts)
    return None


def _role(message: Mapping[str, Any]) -> str:
    role = str(message.get("role", "")).lower()
    return "system" if role == "developer" else role


def _reasoning(message: Mapping[str, Any]) -> str:
    for key in _REASONING_FIELDS:
        value = message.get(key)
        if value:
            return str(value)
    return ""


def _text_parts(text: str | None) -> list[dict[str, Any]]:
    return [] if text is None else [{"type": "text", "text": text}]


def _arguments_json(arguments: Any) -> str:
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    return {
        "id": "" if call.get("id") is None else str(call["id"]),
        "name": fn.get("name", ""),
        "parameters": _arguments_json(fn.get("arguments")),
    }


def _tool_results(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, Sequence) and not isinstance(content, Mapping):
        return [{"type": "text", "text": _part_text(p)} for p in content if _is_text_part(p)]
    return []


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool.get("function", tool)
    return {
        "name": fn.get("name", ""),
        "description": fn.get("description") or "",
        "parameters": fn.get("parameters") if fn.get("parameters") is not None else {},
    }


def to_melody_config(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    grounding: bool = False,
) -> dict[str, Any]:
    """Build the ``render_cmd4`` config for OpenAI-shaped ``messages`` and ``tools``.

    Raises ``ValueError`` for an unsupported role. Melody itself rejects empty or duplicate tool-call
    ids and non-JSON arguments when rendering.
    """
    out: list[dict[str, Any]] = []
    prev_role = ""
    for message in messages:
        role = _role(message)
        if role == "system":
            text = message_text(message.get("content"))
            if prev_role == "system":
                merged = out[-1]
                if text is not None:
                    old = merged["content"]
                    new_text = text if not old else old[0]["text"] + "\n\n" + text
                    merged["content"] = _text_parts(new_text)
            else:
                out.append({"role": "system", "content": _text_parts(text)})
        elif role == "user":
            out.append({"role": "user", "content": _text_parts(message_text(message.get("content")))})
        elif role == "assistant":
            reasoning = _reasoning(message)
            text = message_text(message.get("content"))
            calls = message.get("tool_calls") or []
            if calls:
                if reasoning:
                    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": reasoning}]
                else:
                    content = _text_parts(text)
                out.append(
                    {"role": "chatbot", "content": content, "tool_calls": [_tool_call(c) for c in calls]}
                )
            else:
                content = [{"type": "thinking", "thinking": reasoning}] if reasoning else []
                content.append({"type": "text", "text": text or ""})
                out.append({"role": "chatbot", "content": content})
        elif role == "tool":
            tool_call_id = message.get("tool_call_id")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": "" if tool_call_id is None else str(tool_call_id),
                    "content": _tool_results(message.get("content")),
                }
            )
        else:
            raise ValueError(f"unsupported message role: {message.get('role')!r}")
        prev_role = role
    return {
        "messages": out,
        "available_tools": [_tool(t) for t in tools or []],
        "grounding": "enabled" if grounding else "disabled",
    }
