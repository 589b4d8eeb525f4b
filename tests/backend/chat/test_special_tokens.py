"""Special tokens: complete for what render_cmd4 emits, and single ids in the tokenizer."""

from __future__ import annotations

import re

import cohere_melody

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.chat.melody_config import to_melody_config
from mkcode.backend.chat.tokenizer import ChatTokenizer

_TOKEN_SHAPE = re.compile(r"<\|[A-Z_]+\|>|<[A-Z_]+>")


def test_every_marker_melody_emits_is_a_special_token() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "reasoning": "r",
            "content": None,
            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "x"},
        {"role": "assistant", "reasoning": "r", "content": "a"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]
    rendered = cohere_melody.render_cmd4(to_melody_config(messages, tools, grounding=True))
    emitted = set(_TOKEN_SHAPE.findall(rendered))
    assert emitted <= set(st.SPECIAL_TOKENS)
    assert {st.START_ACTION, st.START_TOOL_RESULT, st.START_THINKING, st.BOS, st.CHATBOT} <= emitted


def test_special_tokens_are_unique_and_eos_is_end_of_turn() -> None:
    assert len(set(st.SPECIAL_TOKENS)) == len(st.SPECIAL_TOKENS)
    assert st.EOS_TOKEN == "<|END_OF_TURN_TOKEN|>"
    assert st.SPECIAL_TOKENS[: len(st.BASE_TOKENS)] == (
        "<PAD>",
        "<UNK>",
        "<CLS>",
        "<SEP>",
        "<MASK_TOKEN>",
        "<BOS_TOKEN>",
        "<EOS_TOKEN>",
    )


def test_special_tokens_are_single_ids(chat_tok: ChatTokenizer) -> None:
    ids = [chat_tok.token_to_id(t) for t in st.SPECIAL_TOKENS]
    assert None not in ids and len(set(ids)) == len(ids)
    for token, token_id in zip(st.SPECIAL_TOKENS, ids):
        assert chat_tok.encode(token) == [token_id]
        assert chat_tok.encode(f"x{token}y")[1:-1] == [token_id]
        assert chat_tok.decode([token_id]) == token
        assert chat_tok.decode([token_id], skip_special_tokens=True) == ""
