"""End to end with the real agents against the shipped demo model (backend/demo/checkpoint, 32K
context) on the CPU: `mkcode serve` as `mkcode serve --model <demo> --device cpu` builds it, with
the OpenCode and Codex configurations that `--print-opencode-config` / `--print-codex-config` print
and no other change, and no scripted decoding: the model's own greedy answers drive the agents.

OpenCode (Chat Completions) completes a tool-call round trip: the model calls one of OpenCode's
tools, OpenCode runs it and sends the result back, the model answers. Codex (Responses) does the
same with its `exec_command` tool: the shipped demo model is trained on both clients' tool sets
(backend/demo/vocabularies.py). OpenCode's grep runs ripgrep, which .ci/run installs.

tests/backend/server/test_e2e_agents.py keeps the deterministic, scripted variant of both.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess

import pytest

from mkcode.app.commands import serve
from mkcode.backend.demo.shipped import SHIPPED_DIR
from mkcode.backend.server.runner import ServerThread, free_port

from .test_e2e_agents import _agent_binary, _events, _run_codex, _run_opencode

pytestmark = pytest.mark.slow


def _args(*extra: str) -> argparse.Namespace:
    serve.register(argparse.ArgumentParser().add_subparsers())
    assert serve._PARSER is not None
    return serve._PARSER.parse_args(["--model", str(SHIPPED_DIR), "--device", "cpu", *extra])


def _printed(args: argparse.Namespace) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert serve.run(args) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def demo_server():
    if not (SHIPPED_DIR / "config.json").exists():
        pytest.skip(f"the demo checkpoint is not shipped in {SHIPPED_DIR}")
    from mkcode.backend.runtime import build_runtime

    port = free_port()
    args = _args("--port", str(port))
    rt = build_runtime(serve._runtime_options(args))
    app = serve._app(rt, args, serve._served_name(args), None, f"http://127.0.0.1:{port}/v1")
    with ServerThread(app, port=port) as srv:
        yield srv, port
    rt.close()


def test_opencode_run_round_trip_on_the_demo_model(demo_server, tmp_path):
    opencode = _agent_binary("opencode-ai", "opencode")
    _, port = demo_server
    config = _printed(_args("--port", str(port), "--print-opencode-config"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text("def build():\n    return 1\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    proc = _run_opencode(opencode, tmp_path, project, config, "Where's build defined?", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = _events(proc.stdout)
    tools = [e["part"] for e in events if e.get("type") == "tool_use"]
    assert tools, proc.stdout[-3000:]
    assert tools[0]["state"]["status"] == "completed", tools[0]
    finishes = [e["part"]["reason"] for e in events if e.get("type") == "step_finish"]
    assert finishes[0] == "tool-calls" and finishes[-1] == "stop", finishes
    steps = [e["part"]["tokens"] for e in events if e.get("type") == "step_finish"]
    assert steps[0]["input"] > 8192  # OpenCode's whole system prompt fits the demo model's context
    assert any(e.get("type") == "text" and e["part"]["text"].strip() for e in events)  # the answer


def test_codex_exec_on_the_demo_model(demo_server, tmp_path):
    codex = _agent_binary("@openai/codex", "codex")
    _, port = demo_server
    config = _printed(_args("--port", str(port), "--print-codex-config"))
    assert "model_context_window = 32768" in config
    work = tmp_path / "work"
    work.mkdir()
    (work / "app.py").write_text("def build():\n    return 1\n")
    proc = _run_codex(codex, tmp_path, work, config, "Run ls in the shell.", timeout=400, json_events=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = _events(proc.stdout)
    done = [e for e in events if e.get("type") == "turn.completed"]
    assert done and done[-1]["usage"]["input_tokens"] > 8192, proc.stdout[-3000:]
    assert done[-1]["usage"]["reasoning_output_tokens"] > 0  # the server counts reasoning tokens
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    messages = [i["text"] for i in items if i.get("type") == "agent_message"]
    assert messages and messages[-1].strip()
    commands = [i for i in items if i.get("type") == "command_execution"]
    assert commands, f"the demo model answered {messages[-1]!r} without calling a Codex tool"
    assert commands[0]["status"] == "completed", commands[0]
