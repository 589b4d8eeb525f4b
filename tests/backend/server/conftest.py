"""Fixtures: a tiny synthetic checkpoint served over real HTTP (uvicorn on a loopback port, in a
thread), and official `openai` clients pointed at it.

The checkpoint has random weights, so what it says is gibberish: tests check shapes, protocol and
invariants (valid JSON under a schema, page accounting), never the text itself.
"""

from __future__ import annotations

import importlib.util

import pytest

REQUIRED = ("fastapi", "uvicorn", "openai", "llguidance", "jsonschema", "httpx")
MISSING = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
if MISSING:  # test_server_deps.py reports the skip; nothing else here can even be imported
    collect_ignore = [
        "helpers.py",
        "test_chat.py",
        "test_completions_responses.py",
        "test_e2e_agents.py",
        "test_e2e_demo.py",
        "test_edge.py",
        "test_errors.py",
        "test_load.py",
        "test_schemathesis.py",
        "test_serve_command.py",
        "test_usage_limits.py",
    ]
else:
    import openai

    from mkcode.backend.runtime import RuntimeOptions, build_runtime
    from mkcode.backend.server import ServerOptions, create_app
    from mkcode.backend.server.runner import ServerThread
    from tests.backend.checkpoint.tiny import tiny_checkpoint

MODEL = "tiny"
API_KEY = "sk-test-key"
CONTEXT = 512  # small context: "max_tokens beyond the context" finishes quickly

# A schema whose every instance is short (bounded strings, enum, bounded integer), so a random
# model under the grammar finishes its call within a few dozen tokens.
READ_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "maxLength": 12},
        "mode": {"enum": ["text", "bytes"]},
        "line": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["path", "mode", "line"],
    "additionalProperties": False,
}
LIST_SCHEMA = {
    "type": "object",
    "properties": {"dir": {"type": "string", "maxLength": 8}},
    "required": ["dir"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "read", "description": "read a file", "parameters": READ_SCHEMA},
    },
    {
        "type": "function",
        "function": {"name": "list", "description": "list a dir", "parameters": LIST_SCHEMA},
    },
]


@pytest.fixture(scope="session")
def runtime(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)
    rt = build_runtime(
        RuntimeOptions(model=path, device="cpu", progress=False, kv_memory_gb=0.05, max_model_len=CONTEXT)
    )
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def server(runtime):
    app = create_app(runtime, options=ServerOptions(served_model_name=MODEL, forced_thinking_tokens=4))
    with ServerThread(app) as s:
        yield s


@pytest.fixture(scope="session")
def guarded_server(runtime):
    """The same engine behind an API key and a 4 KiB body limit."""
    options = ServerOptions(served_model_name=MODEL, api_key=API_KEY, max_body_bytes=4096)
    with ServerThread(create_app(runtime, options=options)) as s:
        yield s


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="anything", max_retries=0, timeout=120)
