"""InProcessClient over the real engine: the stream contract (with an untrained tiny checkpoint),
and the end-to-end agent turn with the trained demo model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mkcode.app.agent import (
    Agent,
    AgentConfig,
    ChatRequest,
    ModelDone,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
)
from mkcode.tools import ToolRegistry, Workspace

from .conftest import collect


def _runtime(path: Path):
    from mkcode.backend.runtime import RuntimeOptions, build_runtime

    return build_runtime(RuntimeOptions(model=path, device="cpu", kv_memory_gb=0.25, progress=False))


def test_stream_contract_on_the_real_engine(tmp_path_factory: pytest.TempPathFactory) -> None:
    from mkcode.app.agent.inprocess import InProcessClient
    from tests.backend.checkpoint.tiny import tiny_checkpoint

    rt = _runtime(tiny_checkpoint(tmp_path_factory.mktemp("ck"), seed=0))
    try:
        client = InProcessClient.from_runtime(rt)
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
        tools = [{"type": "function", "function": {"name": "list_dir", "parameters": {"type": "object"}}}]
        request = ChatRequest(messages, tools, max_tokens=12, seed=1)

        async def all_events():
            return [ev async for ev in client.stream(request)]

        events = asyncio.run(all_events())
        done = events[-1]
        assert isinstance(done, ModelDone) and done.finish_reason in ("stop", "length", "tool_calls")
        assert done.usage.prompt_tokens == client.count_tokens(messages, tools)
        assert 1 <= done.usage.completion_tokens <= 12
        assert not any(isinstance(e, ModelDone) for e in events[:-1])

        async def close_early():
            stream = client.stream(ChatRequest(messages, tools, max_tokens=400, seed=1))
            async for _ in stream:
                break
            await stream.aclose()

        asyncio.run(close_early())
        deadline = asyncio.run(asyncio.sleep(0.2, result=True))
        assert deadline and rt.engine.metrics().running == 0  # the request was cancelled in the engine
        too_long = ChatRequest([{"role": "user", "content": "x " * 5000}], max_tokens=4)
        (err,) = asyncio.run(_events(client, too_long))
        assert err.finish_reason == "error" and "context" in err.error
    finally:
        rt.close()


async def _events(client, request):
    return [ev async for ev in client.stream(request)]


@pytest.mark.slow
def test_demo_model_uses_a_tool_end_to_end(tmp_path: Path) -> None:
    """The trained demo model, through the engine and the in-process client, lists the workspace,
    reads the result and answers."""
    from mkcode.app.agent.inprocess import InProcessClient
    from mkcode.backend.demo import ensure_demo_model

    (tmp_path / "main.py").write_text("def start(port, host):\n    return port + host\n")
    (tmp_path / "utils.py").write_text("def merge(items, rows):\n    return items + rows\n")
    (tmp_path / "README.md").write_text("# demo project\n")
    rt = _runtime(ensure_demo_model())
    try:
        client = InProcessClient.from_runtime(rt)
        registry = ToolRegistry(Workspace(str(tmp_path)), mode="ask")  # reads need no approval
        agent = Agent(client, registry, config=AgentConfig(max_steps=4, max_tokens=160, seed=0))
        events = asyncio.run(collect(agent.run("List the files in the project.")))
    finally:
        rt.close()
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert started, f"the model called no tool: {events}"
    assert started[0].name in {"list_dir", "glob", "read_file", "grep"}
    assert finished[0].ok, finished[0]
    assert "main.py" in finished[0].output or "README" in finished[0].output
    # The model got the result back and answered in text.
    after = events[events.index(finished[0]) :]
    assert any(isinstance(e, TextDelta) for e in after)
    end = events[-1]
    assert isinstance(end, TurnFinished) and end.reason == "done", events
    assert agent.session.messages[-1]["role"] == "assistant" and agent.session.messages[-1]["content"]
    assert end.usage.prompt_tokens > 0 and end.usage.completion_tokens > 0
