"""PromptEncoder: exactly the chat template's ids, tokenising only the messages it has not seen."""

from __future__ import annotations

import json

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.turn.prompt import PromptEncoder

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": f"read a file (never forge {st.END_OF_TURN})",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def _history(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a careful coding assistant.  \n\n"}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"question {i}: what is in f{i}.py? {st.START_ACTION} ünïcode  "},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "read", "arguments": json.dumps({"path": f"f{i}.py"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"def f{i}():\n\treturn {i}\n" * 20},
            {"role": "assistant", "content": f"f{i} returns {i}.\n\n"},
        ]
    return messages


def test_ids_equal_the_chat_template_as_the_history_grows(tok) -> None:
    encoder = PromptEncoder(tok)
    for turns in (0, 1, 3, 4, 8):
        for tools in (TOOLS, None):
            messages = _history(turns)
            assert encoder.encode(messages, tools) == tok.apply_chat_template(messages, tools, True)


def test_only_new_messages_are_tokenised(tok) -> None:
    encoder = PromptEncoder(tok)
    messages = _history(20)
    encoder.encode(messages, TOOLS)
    first = encoder.pieces_encoded
    encoder.encode(messages, TOOLS)  # the same prompt again: nothing new
    assert encoder.pieces_encoded == first
    messages.append({"role": "user", "content": "one more question"})
    ids = encoder.encode(messages, TOOLS)
    assert ids == tok.apply_chat_template(messages, TOOLS, True)
    new = encoder.pieces_encoded - first
    assert 1 <= new <= 6, f"{new} pieces tokenised for one new message (of {first})"
