"""The chat template renders exactly what cohere_melody.render_cmd4 renders (the cmd4 ground truth)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cohere_melody
import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.chat.template import chat_template, render_chat, to_melody_config

from .strategies import conversations, tools

GEN_PROMPT = st.START_OF_TURN + st.CHATBOT


def melody(
    messages: list[dict[str, Any]], tool_list: list[dict[str, Any]] | None, grounding: bool = False
) -> str:
    return cohere_melody.render_cmd4(to_melody_config(messages, tool_list, grounding=grounding))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), tools(), hs.booleans(), hs.booleans())
def test_parity_with_render_cmd4(
    messages: list[dict[str, Any]], tool_list: list[dict[str, Any]], grounding: bool, gen: bool
) -> None:
    expected = melody(messages, tool_list, grounding)
    if not gen:
        assert expected.endswith(GEN_PROMPT)
        expected = expected[: -len(GEN_PROMPT)]
    got = render_chat(chat_template(), messages, tool_list, add_generation_prompt=gen, grounding=grounding)
    assert got == expected


def test_worked_example() -> None:
    """A readable example of the format, checked against Melody too."""
    messages = [
        {"role": "system", "content": "You are mkcode."},
        {"role": "system", "content": "Repo rules."},
        {"role": "user", "content": "Read a.py"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "I will read it.",
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "print('hi')"},
        {"role": "assistant", "content": "It prints hi."},
    ]
    read_tool = {
        "type": "function",
        "function": {"name": "read", "description": "Read a file", "parameters": {"type": "object"}},
    }
    got = render_chat(chat_template(), messages, [read_tool])
    assert got == melody(messages, [read_tool])
    assert got == (
        "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|># Available Tools\n```json\n[\n"
        '    {"name": "read", "description": "Read a file", "parameters": {"type": "object"}, "responses": null}\n'
        "]\n```<|END_TEXT|><|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>You are mkcode.\n\nRepo rules.<|END_TEXT|><|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|><|START_TEXT|>Read a.py<|END_TEXT|><|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>I will read it.<|END_THINKING|><|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "read", "parameters": {"path": "a.py"}}\n'
        "]<|END_ACTION|><|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[\n    {\n"
        '        "tool_call_id": "0",\n        "results": {\n            "0": {"content": "print(\'hi\')"}\n'
        '        },\n        "is_error": null\n    }\n]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>'
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|><|START_TEXT|>It prints hi.<|END_TEXT|>"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )


@pytest.mark.parametrize(
    "messages",
    [
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}] * 2,
            }
        ],
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "", "function": {"name": "f", "arguments": "{}"}}],
            }
        ],
        [{"role": "narrator", "content": "x"}],
    ],
)
def test_invalid_conversations_rejected_like_melody(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(jinja2.exceptions.TemplateError):
        render_chat(chat_template(), messages)
    with pytest.raises(ValueError):
        melody(messages, None)


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(example=conversations(string_arguments=False), tool_list=tools())
def test_transformers_autotokenizer_renders_same(
    hf_tokenizer: Any, example: list[dict[str, Any]], tool_list: list[dict[str, Any]]
) -> None:
    """The saved checkpoint's template works through transformers' apply_chat_template unchanged.

    (Tool-call arguments are objects here: transformers passes strings through unparsed.)
    """
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "héllo <b>"},
        {
            "role": "assistant",
            "content": "plan",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "grep", "arguments": {"q": "x", "n": [1, 2.5]}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py:1"},
        {"role": "assistant", "content": "done", "reasoning_content": "found"},
        *example,
    ]
    rendered = hf_tokenizer.apply_chat_template(
        messages, tools=tool_list or None, tokenize=False, add_generation_prompt=True
    )
    assert rendered == melody(messages, tool_list)
    assert rendered == render_chat(chat_template(), messages, tool_list)
