"""Interruption at any moment, compaction near the context limit, and the session's JSONL record."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from mkcode.app.agent import (
    Agent,
    AgentConfig,
    ApprovalRequested,
    ModelDone,
    Notice,
    Session,
    TextDelta,
    ToolCallFinished,
    TurnFinished,
    Usage,
)
from mkcode.app.agent.context import ELIDED, SUMMARY_PREFIX
from mkcode.tools import ToolRegistry, Workspace

from .conftest import collect
from .scripted import ScriptedClient, call, text_reply, tools_reply
from .test_loop import _Probe, _slow_tools, assert_consistent


def test_interrupt_while_the_model_streams() -> None:
    async def go(registry: ToolRegistry):
        chunks = [TextDelta(f"word{i} ") for i in range(200)]
        client = ScriptedClient(
            [[*chunks, ModelDone("stop", Usage(10, 200))], text_reply("next")], delay_s=0.005
        )
        agent = Agent(client, registry)
        events = []
        async for ev in agent.run("talk"):
            events.append(ev)
            if isinstance(ev, TextDelta) and len(events) == 3:
                agent.interrupt()
        return agent, client, events

    registry = ToolRegistry(Workspace(str(Path.cwd())), mode="ask")
    agent, client, events = asyncio.run(go(registry))
    end = events[-1]
    assert isinstance(end, TurnFinished) and end.reason == "interrupted"
    assert client.closed_early == 1  # the generation was cancelled, not drained
    assert len([e for e in events if isinstance(e, TextDelta)]) < 20
    last = agent.session.messages[-1]
    assert last["role"] == "assistant" and last["content"].startswith("word0 word1")
    assert any(r["type"] == "interrupted" for r in agent.session.records)
    # The agent is usable again afterwards.
    events = asyncio.run(collect(agent.run("again")))
    assert events[-1].reason == "done"


def test_interrupt_during_an_approval(registry: ToolRegistry, workspace: Path) -> None:
    edit = call("edit_file", 0, path="src/calc.py", old_string="a + b", new_string="b + a")
    read = call("read_file", 1, path="README.md")
    client = ScriptedClient([tools_reply(edit, read)])
    agent = Agent(client, registry)

    async def go():
        events = []
        async for ev in agent.run("edit then read"):
            events.append(ev)
            if isinstance(ev, ApprovalRequested):
                agent.interrupt()  # the user hits Esc instead of answering
        return events

    events = asyncio.run(go())
    assert events[-1].reason == "interrupted"
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [f.name for f in finished] == ["edit_file", "read_file"]
    assert finished[0].denied and not finished[0].ok
    assert finished[1].interrupted and "Interrupted" in finished[1].output
    assert (workspace / "src" / "calc.py").read_text().endswith("a + b\n")
    assert_consistent(agent.session.messages)
    assert len(agent.session.tool_calls()) == 2


def test_interrupt_while_a_tool_runs(workspace: Path) -> None:
    probe = _Probe()
    registry = ToolRegistry(Workspace(str(workspace)), mode="full-auto", tools=_slow_tools(probe, 0.5))
    calls = [call("slow_edit", i, n=i) for i in range(3)]
    client = ScriptedClient([tools_reply(*calls)])
    agent = Agent(client, registry, config=AgentConfig(interrupt_grace_s=2.0))

    async def go():
        events = []
        async for ev in agent.run("edit"):
            events.append(ev)
            if len(events) == 1:  # the first edit has started
                asyncio.get_running_loop().call_later(0.1, agent.interrupt)
        return events

    t0 = time.monotonic()
    events = asyncio.run(go())
    assert time.monotonic() - t0 < 1.5
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished[0].ok and finished[0].output == "read 0"  # it finished within the grace period
    assert finished[1].interrupted and finished[2].interrupted
    assert events[-1].reason == "interrupted"
    assert_consistent(agent.session.messages)


def test_interrupt_from_another_thread(registry: ToolRegistry) -> None:
    chunks = [TextDelta("x") for _ in range(500)]
    client = ScriptedClient([[*chunks, ModelDone("stop", Usage())]], delay_s=0.005)
    agent = Agent(client, registry)

    async def go():
        asyncio.get_running_loop().run_in_executor(None, lambda: (time.sleep(0.1), agent.interrupt()))
        return await collect(agent.run("go"))

    events = asyncio.run(go())
    assert events[-1].reason == "interrupted"


def test_closing_the_event_stream_early_interrupts(registry: ToolRegistry) -> None:
    chunks = [TextDelta("x") for _ in range(500)]
    client = ScriptedClient([[*chunks, ModelDone("stop", Usage())]], delay_s=0.002)
    agent = Agent(client, registry)

    async def go():
        agen = agent.run("go")
        async for ev in agen:
            if isinstance(ev, TextDelta):
                break
        await agen.aclose()

    asyncio.run(go())
    assert not agent.busy
    assert any(r["type"] == "interrupted" for r in agent.session.records)


def _big_read_turns(n: int) -> list[Any]:
    replies: list[Any] = []
    for _ in range(n):
        replies += [tools_reply(call("read_file", path="big.txt")), text_reply("read it")]
    return replies


def test_old_tool_outputs_are_elided_first(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "big.txt").write_text("".join(f"{i:04d} " + "x" * 70 + "\n" for i in range(80)))
    client = ScriptedClient(_big_read_turns(4), context_window=8_000)
    config = AgentConfig(max_tokens=500, keep_recent_turns=1, compact_at=0.8)
    agent = Agent(client, registry, config=config)
    notices = []
    for i in range(4):
        events = asyncio.run(collect(agent.run(f"read big.txt ({i})")))
        notices += [e for e in events if isinstance(e, Notice) and e.kind == "compacted"]
        assert events[-1].reason == "done"
    assert notices and "removed" in notices[0].message
    tool_contents = [m["content"] for m in agent.session.messages if m["role"] == "tool"]
    assert ELIDED in tool_contents and tool_contents[-1].startswith("     1\t0000 xxx")
    assert all(agent.client.count_tokens(r.messages, r.tools) < 8_000 for r in client.requests)
    assert_consistent(agent.session.messages)


def test_older_turns_are_summarised_near_the_limit(registry: ToolRegistry, workspace: Path) -> None:
    summaries = []

    def reply(request):
        if not request.tools:  # the summariser's call
            summaries.append(request)
            return text_reply("The user sent several long requests saying please; all were answered.")
        return text_reply("answered")

    long_prompt = "please " * 1500  # long user messages: eliding tool output is not enough
    client = ScriptedClient([reply] * 10, context_window=8000)
    agent = Agent(client, registry, config=AgentConfig(max_tokens=500, keep_recent_turns=1))
    notices = []
    for i in range(4):
        events = asyncio.run(collect(agent.run(f"{long_prompt} {i}")))
        assert events[-1].reason == "done"
        notices += [e for e in events if isinstance(e, Notice) and e.kind == "compacted"]
    assert summaries and summaries[0].tools == []
    assert notices and "summarised" in notices[0].message
    first = agent.session.messages[0]
    assert first["role"] == "user" and first["content"].startswith(SUMMARY_PREFIX)
    assert "several long requests" in first["content"]
    assert agent.session.messages[1]["content"].endswith(" 3") or agent.session.messages[1]["role"] == "user"
    compactions = [r for r in agent.session.records if r["type"] == "compaction"]
    assert compactions and compactions[-1]["tokens_after"] < compactions[-1]["tokens_before"]
    # Every model call fitted the context window.
    assert all(client.count_tokens(r.messages, r.tools) + r.max_tokens <= 8000 for r in client.requests)


def test_summary_falls_back_when_the_model_fails(registry: ToolRegistry) -> None:
    def reply(request):
        if not request.tools:
            return [ModelDone("error", Usage(), "boom")]
        return text_reply("answered")

    long_prompt = "please " * 1500
    client = ScriptedClient([reply] * 10, context_window=8000)
    agent = Agent(client, registry, config=AgentConfig(max_tokens=500, keep_recent_turns=1))
    for i in range(4):
        assert asyncio.run(collect(agent.run(f"{long_prompt} {i}")))[-1].reason == "done"
    first = agent.session.messages[0]
    assert first["content"].startswith(SUMMARY_PREFIX) and "The user asked" in first["content"]


def test_session_jsonl_round_trip(registry: ToolRegistry, tmp_path: Path) -> None:
    client = ScriptedClient(
        [
            tools_reply(call("list_dir")),
            text_reply("listed"),
            tools_reply(call("read_file", path="notes.txt")),
            text_reply("milk"),
        ]
    )
    agent = Agent(client, registry)
    asyncio.run(collect(agent.run("list")))
    path = agent.session.save(tmp_path / "s.jsonl")
    asyncio.run(collect(agent.run("read notes")))
    agent.session.save(path)  # appends only the new records
    loaded = Session.load(path)
    assert loaded.id == agent.session.id
    assert loaded.messages == agent.session.messages
    assert loaded.usage.total_tokens == agent.session.usage.total_tokens > 0
    assert [r["name"] for r in loaded.tool_calls()] == ["list_dir", "read_file"]
    # Resuming: a new agent on the loaded session continues with fresh, unique call ids.
    client2 = ScriptedClient([tools_reply(call("list_dir")), text_reply("again")])
    agent2 = Agent(client2, registry, session=loaded)
    asyncio.run(collect(agent2.run("list again")))
    assert_consistent(agent2.session.messages)
