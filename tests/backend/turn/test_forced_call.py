"""Forced tool calls always arrive (issue 45, item 3): with tool_choice `required` or a named tool,
the thinking budget is capped and the argument strings bounded so that the call closes within
max_tokens, whatever the model writes.

The failing case: max_tokens=300 with the default forced thinking budget (1024 tokens) let the plan
use the whole budget, and the turn ended with finish_reason `length` and no call.
"""

from __future__ import annotations

import json
import random

import pytest

from mkcode.backend.chat.parser import parse_full
from mkcode.backend.turn.constraint import GrammarConstraints
from mkcode.backend.turn.prepare import prepare
from mkcode.backend.turn.prompt import PromptEncoder
from mkcode.backend.turn.request import TurnOptions, TurnRequest

SHELL = {
    "name": "shell",
    "description": "run a command",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command", "description"],
    },
}
EDIT = {
    "name": "edit",
    "description": "edit a file",
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "edits": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["old", "new"],
                },
            },
        },
        "required": ["path", "edits"],
    },
}
CLOSERS = ('"', "}", "]", "\\")


def _adversarial_walk(constraint, tok, vocab: int, limit: int, seed: int) -> list[int]:
    """Decode under `constraint` picking, whenever it can, a token that closes nothing (no quote,
    brace, bracket, end-of-turn or end marker): the longest run the grammar allows."""
    rng = random.Random(seed)
    texts = [tok.decode([i]) for i in range(vocab)]
    eos = set(tok.eos_token_ids)
    out: list[int] = []
    while len(out) < limit + 8:
        allowed = [int(i) for i in constraint.allowed_tokens(vocab).nonzero().flatten()]
        assert allowed, "the grammar allows nothing"
        if set(allowed) <= eos:
            break
        keep = [i for i in allowed if i not in eos and not any(c in texts[i] for c in CLOSERS)]
        keep = [i for i in keep if not texts[i].startswith("<|END")] or keep
        token = rng.choice(keep or [i for i in allowed if i not in eos] or allowed)
        constraint.advance(token)
        assert constraint.error is None, constraint.error
        out.append(token)
    return out


@pytest.mark.parametrize("max_tokens", [150, 300])
@pytest.mark.parametrize("tool,choice", [(SHELL, "required"), (SHELL, "shell"), (EDIT, "edit")])
def test_a_forced_call_closes_within_max_tokens(tok, max_tokens: int, tool: dict, choice: str) -> None:
    grammars = GrammarConstraints(tok, tok.vocab_size, tuple(tok.eos_token_ids))
    request = TurnRequest(
        [{"role": "user", "content": "go"}], [tool], tool_choice=choice, max_tokens=max_tokens
    )
    prepared = prepare(TurnOptions(), PromptEncoder(tok), grammars, 4096, request)
    assert prepared.spec is not None and prepared.spec.thinking_tokens < max_tokens
    for seed in range(2):
        constraint = grammars.for_turn(prepared.spec, lenient_tools=False)
        ids = _adversarial_walk(constraint, tok, tok.vocab_size, max_tokens, seed)
        # The end-of-turn token comes after; the call must fit with it.
        assert len(ids) + 1 <= max_tokens, f"{len(ids)} tokens before the end of the turn"
        parsed = parse_full(tok.decode(ids))
        assert parsed.errors == [] and [c.name for c in parsed.tool_calls] == [tool["name"]]
        args = json.loads(parsed.tool_calls[0].arguments)
        assert set(tool["parameters"]["required"]) <= set(args)


def test_the_thinking_budget_is_capped_by_max_tokens(tok) -> None:
    grammars = GrammarConstraints(tok, tok.vocab_size, tuple(tok.eos_token_ids))
    encoder = PromptEncoder(tok)

    def spec(max_tokens: int, choice: str = "required"):
        request = TurnRequest(
            [{"role": "user", "content": "go"}], [SHELL], tool_choice=choice, max_tokens=max_tokens
        )
        return prepare(TurnOptions(forced_thinking_tokens=1024), encoder, grammars, 8192, request).spec

    assert spec(300).thinking_tokens < 75
    assert spec(8000).thinking_tokens == 1024  # room enough: the configured budget

    def command_chars(max_tokens: int, choice: str = "required") -> int:
        return spec(max_tokens, choice).tools[0].parameters["properties"]["command"]["maxLength"]

    assert command_chars(300) < command_chars(2000) < command_chars(8000, "shell")
    assert command_chars(8000, "shell") > 500  # one call: the whole argument budget
    assert spec(20).thinking_tokens == 0  # no room for a plan: the call comes first


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The tiny random-weight checkpoint behind `mkcode serve`'s app, with its default options."""
    from mkcode.backend.runtime import RuntimeOptions, build_runtime
    from mkcode.backend.server import ServerOptions, create_app
    from mkcode.backend.server.runner import ServerThread
    from tests.backend.checkpoint.tiny import tiny_checkpoint

    path = tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)
    rt = build_runtime(
        RuntimeOptions(model=path, device="cpu", progress=False, kv_memory_gb=0.05, max_model_len=1024)
    )
    assert ServerOptions().forced_thinking_tokens == 1024  # the default the failing case ran with
    try:
        with ServerThread(create_app(rt, options=ServerOptions(served_model_name="tiny"))) as s:
            yield s
    finally:
        rt.close()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "shell"}}])
def test_the_failing_request_now_gets_its_call(server, choice) -> None:
    """Issue 45, item 3: tool_choice required or named, max_tokens=300: a call, finish_reason
    tool_calls (it was `length` with no call)."""
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    for seed in range(2):
        out = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "List the files, then stop."}],
            tools=[{"type": "function", "function": SHELL}],
            tool_choice=choice,
            max_tokens=300,
            temperature=1.0,
            seed=seed,
        )
        choice_out = out.choices[0]
        assert choice_out.finish_reason == "tool_calls", choice_out
        (call,) = choice_out.message.tool_calls
        assert call.function.name == "shell"
        assert set(json.loads(call.function.arguments)) == {"command", "description"}
        assert out.usage.completion_tokens <= 300
