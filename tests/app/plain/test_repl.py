"""Plain mode driven through a prompt-toolkit pipe input: prompts, streamed output, inline
approvals, slash commands with completion, undo, quit."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from mkcode.app.core.conversation import Conversation
from mkcode.app.core.prompt_history import PromptHistory
from mkcode.app.core.sessions import SessionStore
from mkcode.app.plain.repl import MkcodeCompleter, PlainRepl, make_prompt_session
from mkcode.app.settings import Settings
from tests.app.tui.scripted_engine import scripted_backend, text_step, tool_step

pytestmark = pytest.mark.asyncio
EDIT = {"path": "greet.py", "old_string": '"hello"', "new_string": '"hello, world"'}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "greet.py").write_text('def greet():\n    return "hello"\n')
    return ws


async def _run(tmp_path: Path, workspace: Path, steps, keys: str, **settings) -> tuple[str, Conversation]:
    """Run the REPL with `keys` typed (\\r is Enter); returns what it printed."""
    conv = Conversation(
        scripted_backend(steps), Settings(**settings), cwd=workspace, store=SessionStore(tmp_path / "data")
    )
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False, color_system=None)
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(keys)
        session = make_prompt_session(conv, PromptHistory(None), input=pipe, output=DummyOutput())
        code = await asyncio.wait_for(PlainRepl(conv, session, console).run(), timeout=20)
    assert code == 0
    return out.getvalue(), conv


async def test_prompt_streams_answer_and_saves(tmp_path, workspace):
    out, conv = await _run(tmp_path, workspace, [text_step("Hello from the model.")], "hi\r/quit\r")
    assert "Hello from the model." in out
    assert "saved" in out
    assert conv.store.list()[0].title == "hi"


async def test_inline_approval_shows_the_diff_and_applies(tmp_path, workspace):
    steps = [tool_step("edit_file", EDIT), text_step("Edited.")]
    out, _ = await _run(tmp_path, workspace, steps, "edit it\ry\r/quit\r")
    assert "? edit_file greet.py" in out
    assert '+    return "hello, world"' in out  # the diff is printed before the question
    assert "Edited." in out
    assert '"hello, world"' in (workspace / "greet.py").read_text()


async def test_denial_then_undo_and_diff(tmp_path, workspace):
    steps = [tool_step("edit_file", EDIT), text_step("Not edited.")]
    out, conv = await _run(tmp_path, workspace, steps, "edit it\rn\r/diff\r/undo\r/quit\r")
    assert "denied" in out
    assert "no file changes in this session" in out
    assert "undid the last turn" in out
    assert conv.session.messages == []


async def test_multiline_with_trailing_backslash(tmp_path, workspace):
    _, conv = await _run(tmp_path, workspace, [text_step("ok")], "line one\\\rline two\r/quit\r")
    assert conv.session.messages[0]["content"] == "line one\nline two"


async def test_ctrl_d_quits(tmp_path, workspace):
    out, _ = await _run(tmp_path, workspace, [], "/help\r\x04")
    assert "/resume" in out and "saved" in out


async def test_completion_of_commands_and_files(workspace):
    from mkcode.app.core.mentions import FileIndex

    completer = MkcodeCompleter(FileIndex(workspace))
    names = [c.text for c in completer.get_completions(Document("/re"), CompleteEvent())]
    assert names == ["/resume"]
    files = [c.text for c in completer.get_completions(Document("look at @gre"), CompleteEvent())]
    assert files == ["@greet.py"]


async def test_a_bare_enter_or_typed_text_does_not_approve(tmp_path, workspace):
    steps = [tool_step("edit_file", EDIT), text_step("Done.")]
    out, conv = await _run(tmp_path, workspace, steps, "edit it\r\rcan you\rn\r/quit\r")
    assert out.count("answer y, n or a") == 2  # Enter alone and "can you" are not answers
    assert '"hello"' in (workspace / "greet.py").read_text() and not conv.policy.rules


async def test_always_names_the_rule_and_asks_again(tmp_path, workspace):
    steps = [tool_step("edit_file", EDIT), text_step("Done.")]
    _, conv = await _run(tmp_path, workspace, steps, "edit it\ra\rn\ra\ry\r/quit\r")
    assert len(conv.policy.rules) == 1  # the first "a" was not confirmed, the second was
    assert '"hello, world"' in (workspace / "greet.py").read_text()


async def test_a_read_shows_what_the_tool_returned(tmp_path, workspace):
    steps = [tool_step("read_file", {"path": "greet.py"}), text_step("It greets.")]
    out, _ = await _run(tmp_path, workspace, steps, "read it\r/quit\r")
    assert 'return "hello"' in out
