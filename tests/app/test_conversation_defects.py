"""Small things a user noticed: /clear and /quit on an empty chat leave no session file, a failed
first turn leaves none, `ctx` is known right after --continue, /undo names the prompt instead of
putting it back in the input, and the demo model loads under its name with sizes people can read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mkcode.app.agent import Session
from mkcode.app.agent.client import ModelDone
from mkcode.app.agent.events import Usage
from mkcode.app.core import backend as backend_mod
from mkcode.app.core.conversation import Conversation
from mkcode.app.core.sessions import SessionStore
from mkcode.app.settings import Settings
from tests.app.tui.scripted_engine import scripted_backend, text_step, tool_step


def _conv(tmp_path: Path, steps, session: Session | None = None, **settings) -> Conversation:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "a.txt").write_text("one\n")
    return Conversation(
        scripted_backend(steps),
        Settings(**settings),
        cwd=ws,
        store=SessionStore(tmp_path / "data"),
        session=session,
    )


def _files(conv: Conversation) -> list[Path]:
    return sorted(conv.store.sessions_dir.glob("*.jsonl")) if conv.store.sessions_dir.exists() else []


async def _turn(conv: Conversation, prompt: str) -> list:
    return [ev async for ev in conv.turn(prompt)]


def test_clear_and_quit_on_an_empty_chat_write_nothing(tmp_path):
    conv = _conv(tmp_path, [])
    reply = asyncio.run(conv.command("/clear"))
    assert "previous" not in reply.text and _files(conv) == []
    reply = asyncio.run(conv.command("/quit"))
    assert reply.quit and reply.text == "" and _files(conv) == []


def test_clear_after_a_turn_keeps_the_old_session(tmp_path):
    conv = _conv(tmp_path, [text_step("hi")])
    asyncio.run(_turn(conv, "hello"))
    reply = asyncio.run(conv.command("/clear"))
    assert "still on disk" in reply.text and len(_files(conv)) == 1


def test_a_failed_first_turn_leaves_no_session(tmp_path):
    conv = _conv(tmp_path, [[ModelDone("error", Usage(1, 0), error="connection refused")]])
    events = asyncio.run(_turn(conv, "hello"))
    assert events[-1].reason == "error"
    assert _files(conv) == []


def test_a_failed_later_turn_keeps_the_session(tmp_path):
    conv = _conv(tmp_path, [text_step("hi"), [ModelDone("error", Usage(1, 0), error="boom")]])
    asyncio.run(_turn(conv, "hello"))
    asyncio.run(_turn(conv, "again"))
    assert len(_files(conv)) == 1


def test_context_is_known_after_continue(tmp_path):
    first = _conv(tmp_path, [text_step("a long answer " * 20)])
    asyncio.run(_turn(first, "hello"))
    session = first.store.load(first.session.id)
    resumed = _conv(tmp_path, [], session=session)
    assert resumed.context_tokens > 0


def test_undo_names_the_prompt_and_does_not_put_it_back(tmp_path):
    conv = _conv(
        tmp_path,
        [tool_step("write_file", {"path": "b.txt", "content": "x\n"}), text_step("ok")],
        mode="auto-edit",
    )
    asyncio.run(_turn(conv, "make b"))
    reply = asyncio.run(conv.command("/undo"))
    assert "its prompt was: make b" in reply.text and "↑" in reply.text
    assert not hasattr(reply, "prompt")
    assert not (conv.cwd / "b.txt").exists()


def test_sizes_read_as_people_expect():
    assert backend_mod.format_size(3_222_320) == "3.2 MB"
    assert backend_mod.format_size(61.4e9) == "61.4 GB"
    assert backend_mod.format_size(812_000) == "812.0 KB"
    assert backend_mod.format_size(12) == "12 B"


@pytest.mark.slow
def test_the_demo_model_loads_under_its_name(tmp_path):
    stages = []
    b = backend_mod.open_backend(Settings(), lambda stage, _f: stages.append(stage))
    try:
        assert b.model_name.startswith("mkcode-demo v")
        assert not any("trains" in s or "CPU" in s for s in stages)
        weights = [s for s in stages if "loading weights of mkcode-demo" in s and " / " in s]
        assert weights and "0.0 / 0.0" not in weights[-1] and "MB" in weights[-1]
        assert "shipped with mkcode" in (b.notice or "")
    finally:
        b.close()
