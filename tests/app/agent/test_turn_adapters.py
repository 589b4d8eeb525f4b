"""The turn pipeline's two adapters, side by side: the in-process client the TUI's agent uses and the
server (`mkcode serve`, read by the agent's OpenAI-compatible client), over the same scripted engine.

- Same scripted model output → the same model events and the same agent events (the must-show of
  the one-pipeline issue), and the same prompt ids reach the engine.
- The in-process client asks for grammar-constrained tool calls.
- Event-loop time of one model step with a 25K-token history (rendering and tokenising run in a
  worker thread, incrementally): measured and reported; asserted only loosely.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from mkcode.app.agent import Agent, AgentConfig, ChatRequest, ToolCallBegin, ToolCallReady, TurnFinished
from mkcode.app.agent.inprocess import InProcessClient
from mkcode.backend.chat import special_tokens as st
from mkcode.backend.chat.tokenizer import ChatTokenizer
from mkcode.tools import ToolRegistry, Workspace

from ...backend.turn.fakes import ScriptedEngine
from .conftest import collect

WINDOW = 65536


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    from mkcode.backend.demo import shipped_demo_model

    return ChatTokenizer(shipped_demo_model())


def _call(name: str, args: dict) -> str:
    block = json.dumps({"tool_call_id": "0", "tool_name": name, "parameters": args})
    return (
        f"{st.START_THINKING}I should look at the readme first.{st.END_THINKING}"
        f"{st.START_ACTION}[\n    {block}\n]{st.END_ACTION}"
    )


def _answer(text: str) -> str:
    return f"{st.START_THINKING}Now I know.{st.END_THINKING}{st.START_RESPONSE}{text}{st.END_RESPONSE}"


SCRIPT = [_call("read_file", {"path": "README.md"}), _answer("The project is called Demo — 100% sure.")]


class _Server:
    """`mkcode serve`'s app over a scripted engine, on a loopback port."""

    def __init__(self, tok: ChatTokenizer, texts: list[str]) -> None:
        from mkcode.backend.server import ServerOptions, create_app
        from mkcode.backend.server.runner import ServerThread

        self.engine = ScriptedEngine(tok, texts, max_model_len=WINDOW)
        app = create_app(engine=self.engine, tokenizer=tok, options=ServerOptions(served_model_name="m"))
        self.thread = ServerThread(app)

    def __enter__(self):
        self.thread.start()
        from mkcode.app.agent.openai_compat import OpenAICompatClient

        return OpenAICompatClient(self.thread.base_url + "/v1", "m", context_window=WINDOW)

    def __exit__(self, *exc) -> None:
        self.thread.stop()


def _in_process(tok: ChatTokenizer, texts: list[str]) -> tuple[InProcessClient, ScriptedEngine]:
    engine = ScriptedEngine(tok, texts, max_model_len=WINDOW)
    return InProcessClient(engine, tok, model_name="m"), engine  # type: ignore[arg-type]


def _model_events(client, request: ChatRequest) -> list:
    async def go():
        try:
            return [ev async for ev in client.stream(request)]
        finally:
            await client.aclose()

    return asyncio.run(go())


def _same_ids(events: list) -> list:
    """Call ids are random per adapter (`call_<hex>`); number them in order of appearance."""
    ids: dict[str, str] = {}
    out = []
    for ev in events:
        if isinstance(ev, ToolCallBegin | ToolCallReady):
            ev = type(ev)(**{**vars(ev), "call_id": ids.setdefault(ev.call_id, f"id{len(ids)}")})
        out.append(ev)
    return out


def test_the_same_model_events_through_both_adapters(tok, registry: ToolRegistry) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is this?"}]
    request = ChatRequest(messages, registry.openai_tools(), max_tokens=512, seed=3)
    local, local_engine = _in_process(tok, SCRIPT)
    server = _Server(tok, SCRIPT)
    with server as remote_client:
        remote = _model_events(remote_client, request)
    inproc = _model_events(local, request)
    assert local_engine.requests[0].prompt_ids == server.engine.requests[0].prompt_ids
    assert [type(e).__name__ for e in inproc][-2:] == ["ToolCallReady", "ModelDone"]
    assert _same_ids(inproc) == _same_ids(remote)


def test_the_same_agent_turn_through_both_adapters(tok, workspace: Path) -> None:
    def run(client) -> list[dict]:
        registry = ToolRegistry(Workspace(str(workspace)), mode="ask")
        agent = Agent(
            client, registry, config=AgentConfig(max_steps=4, max_tokens=512, seed=0), cwd=workspace
        )
        events = asyncio.run(collect(agent.run("What is this project?")))
        out = []
        for ev in events:
            d = ev.to_dict()
            d.pop("duration_s", None)
            if isinstance(ev, TurnFinished):
                d.pop("context_tokens")  # exact in process, estimated by the remote client
                d["usage"].pop("prompt_tokens"), d["usage"].pop("total_tokens")  # see below
            out.append(d)
        return out

    local, local_engine = _in_process(tok, SCRIPT)
    inproc = run(local)
    server = _Server(tok, SCRIPT)
    with server as remote_client:
        remote = run(remote_client)
    kinds = [e["type"] for e in inproc]
    assert "tool_call_finished" in kinds and kinds[-1] == "turn_finished", kinds
    assert (
        inproc[-1]["reason"] == "done"
        and "# Demo" in next(e for e in inproc if e["type"] == "tool_call_finished")["output"]
    )
    assert inproc == remote
    # The first step's prompt is the same through both. From the second on the remote client leaves
    # the model's past reasoning out of the history it sends (openai_compat.wire_messages: other
    # OpenAI servers do not take it), so the prompts differ by exactly that.
    local_prompts = [tok.decode(r.prompt_ids) for r in local_engine.requests]
    server_prompts = [tok.decode(r.prompt_ids) for r in server.engine.requests]
    assert local_prompts[0] == server_prompts[0]
    plan = "I should look at the readme first."
    assert local_prompts[1].replace(plan, "", 1) == server_prompts[1] != local_prompts[1]


def test_the_tui_agent_gets_grammar_constrained_tool_calls(tok, registry: ToolRegistry) -> None:
    from mkcode.backend.turn.constraint import LLGuidanceConstraint

    client, engine = _in_process(tok, SCRIPT)
    agent = Agent(client, registry, config=AgentConfig(max_steps=4, max_tokens=512))
    asyncio.run(collect(agent.run("What is this project?")))
    assert len(engine.requests) == 2
    assert all(isinstance(r.constraint, LLGuidanceConstraint) for r in engine.requests)
    # The grammar holds the agent's tools: after the call's opening only their names may follow.
    grammar = engine.requests[0].constraint
    head = (
        f'{st.START_THINKING}x{st.END_THINKING}{st.START_ACTION}[\n    {{"tool_call_id": "0", "tool_name": "'
    )
    for token in tok.encode(head):
        assert bool(grammar.allowed_tokens(tok.vocab_size)[token]), tok.decode([token])
        grammar.advance(token)
    allowed = grammar.allowed_tokens(tok.vocab_size)
    assert bool(allowed[tok.encode("read_file")[0]]) and not bool(allowed[tok.encode("delete_all")[0]])
    assert grammar.error is None


def _history(target_tokens: int, client: InProcessClient, registry: ToolRegistry) -> list[dict]:
    body = "\n".join(f"def function_{i}(a, b):\n    return a * {i} + b  # line {i}" for i in range(40))
    messages: list[dict] = []
    i = 0
    while client.count_tokens(messages, registry.openai_tools()) < target_tokens:
        messages += [
            {"role": "user", "content": f"Explain module_{i}.py, please."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_h{i}",
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"module_{i}.py"}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_h{i}", "content": body.replace("function_", f"f{i}_")},
            {"role": "assistant", "content": f"module_{i}.py defines forty small arithmetic functions."},
        ]
        i += 1
    return messages


def test_event_loop_time_per_model_step_with_a_25k_token_history(tok, registry, record_property) -> None:
    import asyncio.events

    client, _ = _in_process(tok, [_answer("Fine.")])
    agent = Agent(client, registry, config=AgentConfig(max_steps=2, max_tokens=256))
    for m in _history(25_000, client, registry):
        agent.session.add_message(m)
    tokens = client.count_tokens(agent._request_messages(), registry.openai_tools())
    assert tokens >= 25_000

    spent = {"cpu": 0.0, "wall": 0.0, "longest": 0.0, "on": False}
    original = asyncio.events.Handle._run

    def timed(handle):
        if not spent["on"]:
            return original(handle)
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            return original(handle)
        finally:
            wall = time.perf_counter() - w0
            spent["cpu"] += time.thread_time() - c0
            spent["wall"] += wall
            spent["longest"] = max(spent["longest"], wall)

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    try:
        asyncio.run(collect(agent.run("warm-up")))  # the first render tokenises the whole history
        per_step = []
        for k in range(3):
            spent.update(cpu=0.0, wall=0.0, longest=0.0, on=True)
            events = asyncio.run(collect(agent.run(f"question {k}")))
            spent["on"] = False
            steps = events[-1].steps
            assert steps == 1
            per_step.append((spent["cpu"] * 1000, spent["wall"] * 1000, spent["longest"] * 1000))
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
    # For comparison: what rendering and tokenising the whole prompt once costs (the agent used to
    # do it about three times per step, on the event loop).
    t0 = time.perf_counter()
    tok.apply_chat_template(agent._request_messages(), registry.openai_tools(), True)
    full_ms = (time.perf_counter() - t0) * 1000
    cpu = max(c for c, _, _ in per_step)
    wall = max(w for _, w, _ in per_step)
    longest = max(n for _, _, n in per_step)
    report = (
        f"event-loop time per model step, {tokens}-token history: {cpu:.1f} ms of the loop thread's CPU; "
        f"{wall:.1f} ms wall in callbacks (GIL waits on the rendering thread included), longest "
        f"callback {longest:.1f} ms (max of {len(per_step)} steps; one full render+tokenise: {full_ms:.0f} ms)"
    )
    print(report)
    record_property("event_loop_ms_per_step", round(cpu, 2))
    record_property("event_loop_report", report)
    assert cpu < 200, report
