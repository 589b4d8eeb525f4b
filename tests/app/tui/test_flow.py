"""Pilot tests of the message flow against the scripted engine: submit → stream → tool card →
approval → answer; interruption; resume; undo; slash commands."""

from __future__ import annotations

import asyncio

import pytest

from mkcode.app.tui.screens.approval import ApprovalScreen
from mkcode.app.tui.screens.chat import ChatScreen
from mkcode.app.tui.widgets.assistant_text import AssistantText
from mkcode.app.tui.widgets.notes import Note, UserPrompt
from mkcode.app.tui.widgets.tool_card import ToolCard
from tests.app.tui.scripted_engine import text_step, tool_step

pytestmark = pytest.mark.asyncio

EDIT = {"path": "greet.py", "old_string": '"hello"', "new_string": '"hello, world"'}


async def _type(pilot, text: str) -> None:
    """Put `text` in the prompt and press Enter (typing key by key is tested separately)."""
    prompt = pilot.app.screen.query_one("#prompt")
    prompt.text = text
    prompt.move_cursor(prompt.document.end)
    await pilot.press("enter")


async def _settle(pilot, app) -> None:
    """Wait until the turn's worker has finished and its messages are handled."""
    for _ in range(200):
        await pilot.pause(0.02)
        screen = app.screen
        conv = app.conversation
        if conv is not None and not conv.busy and not isinstance(screen, ApprovalScreen):
            break
    await app.workers.wait_for_complete()
    await pilot.pause(0.1)


async def test_submit_streams_answer_into_markdown(make_app):
    app = make_app([text_step("Hello **there**, this is a streamed answer.")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _type(pilot, "hi")
        await _settle(pilot, app)
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        [user] = chat.query(UserPrompt)
        assert user.text == "hi"
        [answer] = chat.query(AssistantText)
        assert answer.text == "Hello **there**, this is a streamed answer."
        assert answer.finished and answer.source == answer.text
        assert app.store.list()[0].title == "hi"  # saved to disk


async def test_edit_asks_for_approval_then_applies(make_app, workspace):
    messages = []
    app = make_app([tool_step("edit_file", EDIT, text="I'll edit it."), text_step("Edited.")])
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await _type(pilot, "make it say hello world")
        for _ in range(100):
            await pilot.pause(0.02)
            if isinstance(app.screen, ApprovalScreen):
                break
        modal = app.screen
        assert isinstance(modal, ApprovalScreen)
        assert '+    return "hello, world"' in modal.request.preview  # the diff is in view
        card = app.screen_stack[-2].query_one(ToolCard)
        assert card.state == "waiting"
        await pilot.press("y")
        await _settle(pilot, app)
        assert card.state == "ok"
        assert '"hello, world"' in (workspace / "greet.py").read_text()
        texts = [a.text for a in app.screen.query(AssistantText)]
        assert texts == ["I'll edit it.", "Edited."]
    names = [type(m).__name__ for m in messages]
    assert names.index("Submitted") < names.index("AgentEventArrived") < names.index("TurnEnded")


async def test_denied_edit_leaves_the_file(make_app, workspace):
    app = make_app([tool_step("edit_file", EDIT), text_step("OK, I won't.")])
    async with app.run_test(size=(100, 30)) as pilot:
        await _type(pilot, "edit")
        for _ in range(100):
            await pilot.pause(0.02)
            if isinstance(app.screen, ApprovalScreen):
                break
        await pilot.press("n")
        await _settle(pilot, app)
        assert app.screen.query_one(ToolCard).state == "denied"
        assert '"hello"' in (workspace / "greet.py").read_text()


async def test_escape_interrupts_and_keeps_the_session(make_app):
    gate = asyncio.Event()  # never set: the model "hangs" mid-answer
    app = make_app([[*text_step("Working on it"), gate], text_step("Second answer.")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _type(pilot, "long task")
        for _ in range(100):
            await pilot.pause(0.02)
            if app.screen.query(AssistantText) and app.conversation.busy:
                break
        await pilot.press("escape")
        await _settle(pilot, app)
        notes = [n.text for n in app.screen.query(Note)]
        assert any("interrupted" in n for n in notes)
        session = app.conversation.session
        assert any(r["type"] == "interrupted" for r in session.records)
        await _type(pilot, "go on")
        await _settle(pilot, app)
        assert [u.text for u in app.screen.query(UserPrompt)] == ["long task", "go on"]
        assert app.screen.query(AssistantText).last().text == "Second answer."


async def test_ctrl_c_interrupts_then_twice_quits(make_app):
    gate = asyncio.Event()
    app = make_app([[*text_step("x"), gate]])
    async with app.run_test(size=(80, 24)) as pilot:
        await _type(pilot, "task")
        await pilot.pause(0.2)
        assert app.conversation.busy
        await pilot.press("ctrl+c")
        await _settle(pilot, app)
        assert not app.conversation.busy and app.is_running
        await pilot.press("ctrl+c")  # within the quit window of the first: quits, as an interrupt
        await pilot.pause(0.1)
    assert app.return_code == 130


async def test_ctrl_c_after_the_quit_window_only_warns(make_app, monkeypatch):
    import mkcode.app.tui.screens.chat as chat

    monkeypatch.setattr(chat, "QUIT_WINDOW_S", 0.2)
    app = make_app([])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+c")
        await pilot.pause(0.3)
        await pilot.press("ctrl+c")
        await pilot.pause(0.05)
        assert app.is_running and "again to quit" in app.screen._hint
        await _type(pilot, "/quit")
        await pilot.pause(0.1)
    assert app.return_code == 0


async def test_undo_restores_files_and_conversation(make_app, workspace):
    app = make_app(
        [
            tool_step("write_file", {"path": "new.txt", "content": "x\n"}),
            tool_step("edit_file", EDIT),
            text_step("Done."),
        ],
    )
    app.settings.mode = "auto-edit"
    async with app.run_test(size=(100, 30)) as pilot:
        await _type(pilot, "change things")
        await _settle(pilot, app)
        assert (workspace / "new.txt").exists()
        await _type(pilot, "/undo")
        await pilot.pause(0.2)
        assert not (workspace / "new.txt").exists()
        assert '"hello"' in (workspace / "greet.py").read_text()
        assert app.conversation.session.messages == []
        assert app.screen.query_one("#prompt").text == ""  # not put back: the next command would append to it
        assert "its prompt was: change things" in app.screen.query(Note).last().text
        assert not app.screen.query(AssistantText)


async def test_resume_shows_the_saved_conversation(make_app, store):
    app = make_app([text_step("First answer.")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _type(pilot, "first question")
        await _settle(pilot, app)
        session_id = app.conversation.session.id
    session = store.load(session_id)
    app2 = make_app([text_step("Second answer.")], session=session)
    async with app2.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        assert [u.text for u in app2.screen.query(UserPrompt)] == ["first question"]
        assert app2.screen.query_one(AssistantText).text == "First answer."
        await _type(pilot, "second question")
        await _settle(pilot, app2)
        # the model saw the whole history
        request = app2.conversation.backend.client.requests[-1]
        assert [m["content"] for m in request.messages if m["role"] == "user"] == [
            "first question",
            "second question",
        ]


async def test_slash_commands(make_app):
    app = make_app([])
    async with app.run_test(size=(80, 24)) as pilot:
        await _type(pilot, "/help")
        await pilot.pause(0.1)
        help_note = app.screen.query(Note).last()
        assert "/undo" in help_note.text and "Esc" in help_note.text
        await _type(pilot, "/mode full-auto")
        await pilot.pause(0.1)
        assert app.conversation.mode == "full-auto"
        await _type(pilot, "/bogus")
        await pilot.pause(0.1)
        assert "unknown command" in app.screen.query(Note).last().text
        await _type(pilot, "/quit")
        await pilot.pause(0.1)
    assert not app.is_running


async def test_slash_completion_with_tab(make_app):
    app = make_app([])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("/", "u", "n")
        await pilot.pause(0.1)
        assert app.screen.prompt.completion_open
        await pilot.press("tab")
        await pilot.pause(0.1)
        assert app.screen.prompt.text == "/undo "


async def test_at_file_completion_and_attachment(make_app):
    app = make_app([text_step("It returns hello.")])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(*"what does @gr")
        await pilot.pause(0.1)
        await pilot.press("tab")
        assert app.screen.prompt.text == "what does @greet.py "
        await pilot.press(*"do", "enter")
        await _settle(pilot, app)
        sent = app.conversation.backend.client.requests[0].messages[-1]["content"]
        assert '<file path="greet.py">' in sent and 'return "hello"' in sent
        assert app.screen.query_one(UserPrompt).text == "what does @greet.py do"


async def test_prompt_history_with_up(make_app):
    app = make_app([text_step("one"), text_step("two")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _type(pilot, "first")
        await _settle(pilot, app)
        await pilot.press("up")
        assert app.screen.prompt.text == "first"
        await pilot.press("down")
        assert app.screen.prompt.text == ""


async def test_turn_finished_reports_context(make_app):
    app = make_app([text_step("ok")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _type(pilot, "hi")
        await _settle(pilot, app)
        events = [e for e in app.conversation.session.records if e["type"] == "usage"]
        assert events and app.conversation.context_tokens > 0
        assert "ctx" in str(app.screen.status_bar.render())


async def test_a_paste_read_a_few_keys_at_a_time_is_inserted_per_burst_window(make_app):
    """tmux delivers a paste without bracketed paste ~32 keys per read: inserting each read's keys
    re-wrapped the whole line each time (quadratic: ~25 s for 54 KB); within a burst the prompt
    inserts at most once per BURST_S, yet a key typed after a quiet moment is inserted at once."""
    import asyncio

    from textual import events
    from textual.widgets import TextArea

    from mkcode.app.tui.widgets.prompt import BURST_S

    changes = []
    text = "word " * 1200  # 6,000 characters in 200 reads of 30
    app = make_app([text_step("ok")])
    async with app.run_test(size=(80, 24), message_hook=changes.append) as pilot:
        prompt = app.screen.prompt
        t0 = asyncio.get_running_loop().time()
        for i in range(0, len(text), 30):
            for ch in text[i : i + 30]:
                prompt.post_message(events.Key(ch if ch != " " else "space", ch))
            await asyncio.sleep(0.002)  # the next read
        for _ in range(100):
            if len(prompt.text) == len(text):
                break
            await pilot.pause(0.02)
        took = asyncio.get_running_loop().time() - t0
        assert prompt.text == text
        inserts = len({id(m) for m in changes if isinstance(m, TextArea.Changed)})  # (each bubbles up)
        assert inserts <= took / BURST_S + 3, (inserts, took)  # one per read would be 200
        await pilot.pause(2 * BURST_S)  # a quiet moment, then one key: in at once
        prompt.post_message(events.Key("x", "x"))
        await pilot.pause()
        assert prompt.text.endswith("x")


async def test_ctrl_c_clears_keys_a_burst_still_holds(make_app):
    """Keys of a burst wait up to BURST_S in the prompt's buffer; a binding above the prompt (Ctrl+C
    clears it) must see them: the app inserts them before any other key, so none lands after."""
    from mkcode.app.tui.widgets.prompt import BURST_S

    app = make_app([text_step("ok")])
    async with app.run_test(size=(80, 24)) as pilot:
        prompt = app.screen.prompt
        prompt.take_typed("a")
        await pilot.pause()  # inserted at once: the burst window opens
        for ch in "bcdef":
            prompt.take_typed(ch)  # held for the window
        assert prompt.text == "a"
        await pilot.press("ctrl+c")
        await pilot.pause(3 * BURST_S)
        assert prompt.text == ""


async def test_a_paste_delivered_as_keys_is_inserted_in_batches(make_app):
    """Without bracketed paste a terminal sends a paste as one key per character: they are inserted
    a batch at a time (few `Changed` events), in order, and Enter still submits afterwards."""
    from textual import events
    from textual.widgets import TextArea

    changes = []
    text = "word " * 4000  # 20 000 characters
    app = make_app([text_step("ok")])
    async with app.run_test(size=(80, 24), message_hook=changes.append) as pilot:
        prompt = app.screen.prompt
        for ch in text:  # all queued before any is handled, as a terminal's read delivers them
            prompt.post_message(events.Key(ch if ch != " " else "space", ch))
        for _ in range(500):
            await pilot.pause(0.02)
            if len(prompt.text) == len(text):
                break
        assert prompt.text == text
        assert sum(isinstance(m, TextArea.Changed) for m in changes) < 20
        await pilot.press("enter")
        await _settle(pilot, app)
        assert app.screen.query_one(UserPrompt).text == text.strip()
