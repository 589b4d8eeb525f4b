"""Usage and output limits through the HTTP adapters, over a scripted engine (tests/backend/turn/
fakes.py): reasoning tokens are counted in both APIs' usage, and a request that names no output
limit gets the server's default cap instead of the rest of the context."""

from __future__ import annotations

import json

import httpx
import pytest

from mkcode.backend.server import ServerOptions, create_app
from mkcode.backend.server.options import output_cap
from mkcode.backend.server.runner import ServerThread
from tests.backend.turn.fakes import ScriptedEngine

THOUGHT = "Let me think about it."
TURN = f"<|START_THINKING|>{THOUGHT}<|END_THINKING|><|START_TEXT|>hi there<|END_TEXT|>"
CONTEXT = 4096


@pytest.fixture()
def scripted(runtime):
    tok = runtime.tokenizer

    def serve(**options):
        engine = ScriptedEngine(tok, [TURN], max_model_len=CONTEXT)
        app = create_app(
            engine=engine, tokenizer=tok, options=ServerOptions(served_model_name="m", **options)
        )
        return engine, ServerThread(app)

    return tok, serve


def test_reasoning_tokens_in_usage(scripted):
    tok, serve = scripted
    expected = len(tok.encode(THOUGHT)) + 2  # the text and its two markers
    _, srv = serve()
    with srv:
        r = httpx.post(srv.base_url + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=60).json()
        assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == expected
        assert r["output"][0]["type"] == "reasoning"
        body = {"model": "m", "input": "hi", "stream": True}
        with httpx.stream("POST", srv.base_url + "/v1/responses", json=body, timeout=60) as resp:
            lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
        done = json.loads(lines[-1][6:])
        assert done["type"] == "response.completed"
        assert done["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == expected

        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(srv.base_url + "/v1/chat/completions", json=chat, timeout=60).json()
        assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == expected
        assert r["choices"][0]["message"]["reasoning_content"] == THOUGHT
        stream = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=stream, timeout=60) as resp:
            lines = [line for line in resp.iter_lines() if line.startswith("data: {")]
        assert json.loads(lines[-1][6:])["usage"]["completion_tokens_details"]["reasoning_tokens"] == expected


def test_default_output_cap(scripted):
    _, serve = scripted
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    engine, srv = serve()
    with srv:
        httpx.post(srv.base_url + "/v1/chat/completions", json=chat, timeout=60).raise_for_status()
        httpx.post(srv.base_url + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=60)
        httpx.post(srv.base_url + "/v1/chat/completions", json={**chat, "max_tokens": 3000}, timeout=60)
    caps = [r.sampling.max_tokens for r in engine.requests]
    assert caps[:2] == [output_cap(CONTEXT), output_cap(CONTEXT)] == [1024, 1024]
    assert caps[2] == 3000  # what the client asks for wins
    engine, srv = serve(default_max_tokens=None)  # no cap: the rest of the context
    with srv:
        httpx.post(srv.base_url + "/v1/chat/completions", json=chat, timeout=60).raise_for_status()
    assert engine.requests[0].sampling.max_tokens == CONTEXT - len(engine.requests[0].prompt_ids)
