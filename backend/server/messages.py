"""OpenAI chat messages and Responses input items → the plain messages the chat template renders.

- Content given as parts keeps its text parts (`text`, `input_text`, `output_text`); images and
  audio are refused (the model reads text only).
- All system/developer messages are merged into one leading system message (clients such as
  OpenCode send several; the cmd4 template has one system turn).
- Tool-call arguments stay as given (JSON strings are parsed by the template renderer).
"""

from __future__ import annotations

import json
from typing import Any

from mkcode.backend.server.errors import bad_request
from mkcode.backend.server.schemas import ChatMessage, MessageToolCall, ToolCallFunction

_TEXT_PARTS = ("text", "input_text", "output_text")


def content_text(content: Any, where: str) -> str | None:
    """The text of a message content: a string, or the concatenated text parts of a list."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict):
                raise bad_request(f"{where}[{i}]: a content part must be an object or a string", param=where)
            kind = part.get("type", "text")
            field = "refusal" if kind == "refusal" else "text"
            if kind in _TEXT_PARTS or kind == "refusal":
                if not isinstance(part.get(field), str):
                    got = (
                        "is missing"
                        if field not in part
                        else f"is {type(part[field]).__name__}, not a string"
                    )
                    raise bad_request(
                        f"{where}[{i}]: a {kind!r} content part needs a string {field!r} ({field!r} {got})",
                        param=where,
                    )
                texts.append(part[field])
            else:
                raise bad_request(
                    f"{where}[{i}]: content part of type {kind!r} is not supported (this model reads text only)",
                    param=where,
                )
        return "".join(texts)
    raise bad_request(f"{where}: content must be a string or a list of text parts", param=where)


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Validated chat messages → template messages, with the system messages merged in front."""
    system: list[str] = []
    rest: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}].content"
        text = content_text(m.content, where)
        if m.role in ("system", "developer"):
            if text:
                system.append(text)
            continue
        out: dict[str, Any] = {"role": m.role, "content": text if text is not None else ""}
        if m.role == "assistant":
            reasoning = m.reasoning_content or m.reasoning
            if reasoning:
                out["reasoning_content"] = reasoning
            if m.tool_calls:
                calls = []
                for k, tc in enumerate(m.tool_calls):
                    args = tc.function.arguments
                    if isinstance(args, str) and args.strip():
                        try:
                            json.loads(args)
                        except ValueError:
                            raise bad_request(
                                f"messages[{i}].tool_calls[{k}].function.arguments is not valid JSON",
                                param=f"messages[{i}].tool_calls",
                            ) from None
                    calls.append(
                        {
                            "id": tc.id or f"call_{i}_{k}",
                            "type": "function",
                            "function": {"name": tc.function.name, "arguments": args or "{}"},
                        }
                    )
                out["tool_calls"] = calls
        elif m.role == "tool":
            if not m.tool_call_id:
                raise bad_request(f"messages[{i}]: a tool message needs tool_call_id", param=f"messages[{i}]")
            out["tool_call_id"] = m.tool_call_id
        rest.append(out)
    if not rest:
        raise bad_request(
            "messages: at least one user, assistant or tool message is needed", param="messages"
        )
    head = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    return head + rest


def responses_messages(instructions: str | None, items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses `instructions` + `input` → chat messages (then merged like chat messages).

    Consecutive `function_call` items (with any assistant text right before them) become one
    assistant message with parallel tool calls; `function_call_output` becomes a tool message.
    Reasoning items and item types this server never produces are skipped.
    """
    raw: list[ChatMessage] = []
    if instructions:
        raw.append(ChatMessage(role="system", content=instructions))
    if isinstance(items, str):
        raw.append(ChatMessage(role="user", content=items))
        return chat_messages(raw)
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"input[{i}]: unsupported message role {role!r}", param="input")
            text = content_text(item.get("content"), f"input[{i}].content")
            raw.append(ChatMessage(role=role, content=text or ""))
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise bad_request(f"input[{i}]: function_call needs string name and call_id", param="input")
            args = item.get("arguments")
            if args is not None and not isinstance(args, str | dict):
                raise bad_request(
                    f"input[{i}].arguments: a function_call's arguments must be a JSON string "
                    f"(or an object), not {type(args).__name__}",
                    param=f"input[{i}].arguments",
                )
            call = MessageToolCall(id=call_id, function=ToolCallFunction(name=name, arguments=args or "{}"))
            last = raw[-1] if raw else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                raw.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"input[{i}]: function_call_output needs a string call_id", param="input")
            output = item.get("output")
            if not isinstance(output, str):
                output = (
                    content_text(output, f"input[{i}].output")
                    if isinstance(output, list)
                    else json.dumps(output)
                )
            raw.append(ChatMessage(role="tool", tool_call_id=call_id, content=output))
        # reasoning, web_search_call, … : nothing the prompt needs
    return chat_messages(raw)
