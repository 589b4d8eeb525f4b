"""The agent loop against a scripted engine: tool use, parallel reads, malformed output, approvals,
interruption, step limit, truncation, backend errors."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from mkcode.app.agent import (
    Agent,
    AgentConfig,
    AgentError,
    ApprovalRequested,
    ModelDone,
    Notice,
    TextDelta,
    ToolCallFinished,
    TurnFinished,
    Usage,
)
from mkcode.tools import Decision, ToolRegistry, Workspace
from mkcode.tools.result import ToolResult
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema

from .conftest import collect
from .scripted import ScriptedClient, call, malformed_reply, text_reply, tools_reply


def run(coro):
    return asyncio.run(coro)


def assert_consistent(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call is answered by exactly one tool message right after it."""
    i = 0
    while i < len(messages):
        m = messages[i]
        ids = [c["id"] for c in m.get("tool_calls") or []]
        if ids:
            following = messages[i + 1 : i + 1 + len(ids)]
            assert [t.get("role") for t in following] == ["tool"] * len(ids), messages
            assert sorted(t["tool_call_id"] for t in following) == sorted(ids)
            i += len(ids)
        i += 1
    all_ids = [c["id"] for m in messages for c in m.get("tool_calls") or []]
    assert len(all_ids) == len(set(all_ids)), "tool call ids must be unique"


def test_multi_step_tool_use(registry: ToolRegistry) -> None:
    client = ScriptedClient(
        [
            tools_reply(call("list_dir", path=".")),
            tools_reply(call("read_file", path="src/calc.py")),
            text_reply("calc.py defines add."),
        ]
    )
    agent = Agent(client, registry)
    events = run(collect(agent.run("what does calc.py do?")))
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "ToolCallStarted",
        "ToolCallFinished",
        "ToolCallStarted",
        "ToolCallFinished",
        "TextDelta",
        "TurnFinished",
    ]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished[0].ok and "README.md" in finished[0].output
    assert finished[1].ok and "return a + b" in finished[1].output
    end = events[-1]
    assert isinstance(end, TurnFinished) and end.reason == "done" and end.steps == 3
    assert end.usage.prompt_tokens == 300 and end.usage.completion_tokens == 25
    # The model saw the tool results, under the ids the agent gave the calls.
    last = client.requests[-1].messages
    assert last[0]["role"] == "system"
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "tool", "assistant", "tool"]
    assert last[3]["tool_call_id"] == last[2]["tool_calls"][0]["id"]
    assert "return a + b" in last[5]["content"]
    assert client.requests[0].tools and {t["function"]["name"] for t in client.requests[0].tools} >= {
        "read_file",
        "list_dir",
    }
    assert agent.session.messages[-1] == {"role": "assistant", "content": "calc.py defines add."}
    assert_consistent(agent.session.messages)
    assert [r["name"] for r in agent.session.tool_calls()] == ["list_dir", "read_file"]


class _Probe:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def enter(self) -> None:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)

    def leave(self) -> None:
        with self.lock:
            self.active -= 1


def _slow_tools(probe: _Probe, seconds: float = 0.3) -> list[Tool]:
    class SlowRead(Tool):
        name = "slow_read"
        kind = ToolKind.READ
        description = "read slowly"
        parameters: ClassVar[dict[str, Any]] = object_schema({"n": {"type": "integer"}}, ["n"])

        def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared:
            def go() -> ToolResult:
                probe.enter()
                time.sleep(seconds)
                probe.leave()
                return ToolResult.success(f"read {args['n']}")

            return Prepared(preview="", run=go)

    class SlowEdit(SlowRead):
        name = "slow_edit"
        kind = ToolKind.EDIT

    return [SlowRead(), SlowEdit()]


def test_reads_run_in_parallel_edits_one_at_a_time(workspace: Path) -> None:
    probe = _Probe()
    registry = ToolRegistry(Workspace(str(workspace)), mode="full-auto", tools=_slow_tools(probe))
    reads = [call("slow_read", i, n=i) for i in range(4)]
    client = ScriptedClient([tools_reply(*reads), text_reply("done")])
    agent = Agent(client, registry)
    t0 = time.monotonic()
    events = run(collect(agent.run("read four things")))
    elapsed = time.monotonic() - t0
    assert probe.max_active == 4 and elapsed < 1.0
    outputs = [e.output for e in events if isinstance(e, ToolCallFinished)]
    assert outputs == ["read 0", "read 1", "read 2", "read 3"]  # model order, not finishing order
    tool_msgs = [m for m in agent.session.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == outputs

    probe2 = _Probe()
    registry2 = ToolRegistry(Workspace(str(workspace)), mode="full-auto", tools=_slow_tools(probe2, 0.1))
    edits = [call("slow_edit", i, n=i) for i in range(3)]
    agent2 = Agent(ScriptedClient([tools_reply(*edits), text_reply("ok")]), registry2)
    run(collect(agent2.run("edit three things")))
    assert probe2.max_active == 1


def test_malformed_output_is_reported_to_the_model_and_the_loop_goes_on(registry: ToolRegistry) -> None:
    client = ScriptedClient(
        [
            malformed_reply("the tool-call block is not valid JSON"),
            tools_reply(call("no_such_tool", x=1)),
            tools_reply(call("read_file", path=42)),  # schema violation
            text_reply("sorry, done"),
        ]
    )
    agent = Agent(client, registry)
    events = run(collect(agent.run("go")))
    notices = [e for e in events if isinstance(e, Notice)]
    assert notices and notices[0].kind == "malformed_output"
    # The model was told what was wrong, as a message it can read.
    second = client.requests[1].messages
    assert second[-1]["role"] == "user" and "not valid JSON" in second[-1]["content"]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert not finished[0].ok and "unknown tool" in finished[0].output
    assert not finished[1].ok and "invalid arguments" in finished[1].output
    assert isinstance(events[-1], TurnFinished) and events[-1].reason == "done" and events[-1].steps == 4
    assert_consistent(agent.session.messages)


async def _answer_approvals(agent: Agent, prompt: str, decision: Decision) -> list:
    out = []
    async for ev in agent.run(prompt):
        out.append(ev)
        if isinstance(ev, ApprovalRequested):
            ev.answer(decision, message="not now" if decision is Decision.DENY else "")
    return out


def test_denied_edit(registry: ToolRegistry, workspace: Path) -> None:
    edit = call("edit_file", path="src/calc.py", old_string="a + b", new_string="b + a")
    client = ScriptedClient([tools_reply(edit), text_reply("ok, I left it")])
    agent = Agent(client, registry)
    events = run(_answer_approvals(agent, "swap it", Decision.DENY))
    asks = [e for e in events if isinstance(e, ApprovalRequested)]
    assert (
        len(asks) == 1
        and asks[0].request.tool == "edit_file"
        and "+    return b + a" in asks[0].request.preview
    )
    done = next(e for e in events if isinstance(e, ToolCallFinished))
    assert done.denied and not done.ok and "not now" in done.output
    assert (workspace / "src" / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    perms = agent.session.permissions()
    assert perms[0]["decision"] == "deny" and perms[0]["call_id"] == done.call_id
    assert "Denied" in client.requests[1].messages[-1]["content"]


def test_allowed_edit_carries_its_diff_and_always_is_remembered(
    registry: ToolRegistry, workspace: Path
) -> None:
    e1 = call("edit_file", path="src/calc.py", old_string="a + b", new_string="b + a")
    e2 = call("edit_file", path="src/calc.py", old_string="def add", new_string="def plus")
    client = ScriptedClient([tools_reply(e1), tools_reply(e2), text_reply("done")])
    agent = Agent(client, registry)
    events = run(_answer_approvals(agent, "edit", Decision.ALLOW_ALWAYS))
    assert len([e for e in events if isinstance(e, ApprovalRequested)]) == 1  # the second was remembered
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert all(f.ok for f in finished)
    assert finished[0].diff and "+    return b + a" in finished[0].diff
    assert (workspace / "src" / "calc.py").read_text() == "def plus(a, b):\n    return b + a\n"
    assert agent.session.permissions()[0]["decision"] == "allow_always"
    decisions = [r for r in agent.session.records if r["type"] == "tool_decision"]
    assert [d["decided_by"].split(":")[0] for d in decisions] == ["user", "rule"]


def test_step_limit(registry: ToolRegistry) -> None:
    client = ScriptedClient([tools_reply(call("list_dir")) for _ in range(3)])
    agent = Agent(client, registry, config=AgentConfig(max_steps=3))
    events = run(collect(agent.run("loop forever")))
    assert (
        isinstance(events[-1], TurnFinished) and events[-1].reason == "step_limit" and events[-1].steps == 3
    )
    assert any(isinstance(e, Notice) and e.kind == "step_limit" for e in events)
    assert_consistent(agent.session.messages)


def test_long_tool_output_is_truncated(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "big.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    client = ScriptedClient([tools_reply(call("read_file", path="big.txt")), text_reply("big")])
    agent = Agent(client, registry, config=AgentConfig(max_tool_output_chars=2000))
    events = run(collect(agent.run("read big.txt")))
    done = next(e for e in events if isinstance(e, ToolCallFinished))
    assert done.truncated and len(done.output) <= 2000 and "characters omitted" in done.output
    assert "line 0" in done.output  # head kept
    assert any(isinstance(e, Notice) and e.kind == "output_truncated" for e in events)
    assert client.requests[1].messages[-1]["content"] == done.output


def test_backend_error_ends_the_turn_cleanly(registry: ToolRegistry) -> None:
    client = ScriptedClient(
        [
            [TextDelta("partial"), ModelDone("error", Usage(), "engine exploded")],
            text_reply("second turn works"),
        ]
    )
    agent = Agent(client, registry)
    events = run(collect(agent.run("hi")))
    assert any(isinstance(e, AgentError) and "exploded" in e.message for e in events)
    assert isinstance(events[-1], TurnFinished) and events[-1].reason == "error"
    events = run(collect(agent.run("again")))
    assert events[-1].reason == "done"


def test_system_prompt_has_environment_and_agents_md(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "AGENTS.md").write_text("Always run `make check` before answering.\n")
    client = ScriptedClient([text_reply("hello")])
    agent = Agent(client, registry)
    run(collect(agent.run("hi")))
    system = client.requests[0].messages[0]["content"]
    assert str(workspace.resolve()) in system and "Platform:" in system and "Date:" in system
    assert "make check" in system
    assert any(r["type"] == "system_prompt" for r in agent.session.records)
