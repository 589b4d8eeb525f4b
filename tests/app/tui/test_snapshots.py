"""Snapshot tests of the main screens at fixed sizes (SVG via `App.export_screenshot()`).

pytest-textual-snapshot pins pytest<9, so the comparison is done here: each test renders the
screen, and the SVG must equal `snapshots/<name>.svg`. A missing file is written (commit it);
`MKCODE_UPDATE_SNAPSHOTS=1 pytest tests/app/tui/test_snapshots.py` rewrites them all after an
intended visual change. Open the SVGs in a browser to review; each test's docstring says what you
should see.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from mkcode.app.agent import Session
from mkcode.app.settings import Settings
from mkcode.app.tui.app import MkcodeApp
from mkcode.app.tui.screens.approval import ApprovalScreen
from mkcode.app.tui.screens.start import StartScreen
from tests.app.tui.scripted_engine import scripted_backend, text_step, tool_step

pytestmark = pytest.mark.asyncio

SNAPSHOTS = Path(__file__).parent / "snapshots"
ANSWER = (
    "Here is the function, renamed:\n\n"
    '```python\ndef greet(name: str) -> str:\n    return f"hello, {name}"\n```\n\n'
    "- it takes a **name**\n- it returns a greeting\n"
)


def assert_snapshot(app: MkcodeApp, name: str) -> None:
    svg = app.export_screenshot(title=name)
    path = SNAPSHOTS / f"{name}.svg"
    if os.environ.get("MKCODE_UPDATE_SNAPSHOTS") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        return
    expected = path.read_text(encoding="utf-8")
    if svg != expected:
        failed = path.with_suffix(".failed.svg")
        failed.write_text(svg, encoding="utf-8")
        pytest.fail(
            f"{name}: screen differs from {path.name}; see {failed} (MKCODE_UPDATE_SNAPSHOTS=1 to accept)"
        )


async def _freeze(pilot) -> None:
    """No blinking cursor: the picture must not depend on when it is taken."""
    for area in pilot.app.screen.query("PromptInput"):
        area.cursor_blink = False
    await pilot.pause(0.1)


async def _send(pilot, text: str) -> None:
    prompt = pilot.app.screen.query_one("#prompt")
    prompt.text = text
    await pilot.press("end", "enter")


async def _idle(pilot) -> None:
    for _ in range(200):
        await pilot.pause(0.02)
        conv = pilot.app.conversation
        if conv is not None and not conv.busy:
            break
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.2)


def _app(workspace, store, steps, *, theme: str = "dark", mode: str = "ask") -> MkcodeApp:
    session = Session(id="5e55104c0ffee000", cwd=str(workspace), model="scripted-model")
    return MkcodeApp(
        Settings(theme=theme, mode=mode),
        cwd=workspace,
        store=store,
        backend=scripted_backend(steps),
        session=session,
    )


async def test_answer_80x24(workspace, store):
    """A user prompt in a bar, a collapsed "▶ Thought (6 words)" line, then the answer as Markdown: a highlighted Python code
    block and a two-item bullet list; the prompt box below it, and the status bar reading
    "scripted-model │ … │ 42.0 tok/s │ ctx …% │ mode ask"."""
    app = _app(workspace, store, [text_step(ANSWER, chunk=7, reasoning="Rename it and add a parameter.")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _send(pilot, "rename greet to take a name")
        await _idle(pilot)
        await _freeze(pilot)
        assert_snapshot(app, "answer_80x24")


async def test_tool_cards_120x36_light(workspace, store):
    """Light theme, auto-edit mode. Two tool cards: "✓ read_file greet.py" with the file's two
    numbered lines (what the tool returned) and
    "✓ write_file hello.txt" with its green "+hello" diff; then the answer "Created hello.txt."
    The status bar shows "mode auto-edit" highlighted."""
    steps = [
        tool_step("read_file", {"path": "greet.py"}),
        tool_step("write_file", {"path": "hello.txt", "content": "hello\n"}),
        text_step("Created hello.txt."),
    ]
    app = _app(workspace, store, steps, theme="light", mode="auto-edit")
    async with app.run_test(size=(120, 36)) as pilot:
        await _send(pilot, "write hello.txt")
        await _idle(pilot)
        await _freeze(pilot)
        assert_snapshot(app, "tool_cards_120x36_light")


async def test_approval_80x24(workspace, store):
    """The approval modal over the transcript: "Allow edit_file greet.py?", the reason (file
    edits need approval in mode ask), the diff with -"hello" / +"hello, world", and three buttons:
    Allow once (y), Always (a): edit_file, Deny (n), none focused; under them the key hint
    "y allow once · a always (shows the rule, asks again) · n or Esc deny · …"."""
    edit = {"path": "greet.py", "old_string": '"hello"', "new_string": '"hello, world"'}
    app = _app(workspace, store, [tool_step("edit_file", edit), text_step("ok")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _send(pilot, "say hello world")
        for _ in range(100):
            await pilot.pause(0.02)
            if isinstance(app.screen, ApprovalScreen):
                break
        await pilot.pause(0.2)
        assert_snapshot(app, "approval_80x24")
        await pilot.press("n")
        await _idle(pilot)


async def test_help_80x24(workspace, store):
    """/help lists every slash command with its one-line description, then the key bindings."""
    app = _app(workspace, store, [])
    async with app.run_test(size=(80, 24)) as pilot:
        await _send(pilot, "/help")
        await pilot.pause(0.2)
        await _freeze(pilot)
        assert_snapshot(app, "help_80x24")


async def test_start_screen_80x24(workspace, store):
    """The start screen while the model loads: "mkcode", the workspace path (a temp dir), the
    stage "loading weights of north-mini-code" and a progress bar about a third full."""
    release = threading.Event()

    def slow_factory(settings, progress):
        progress("loading weights of north-mini-code", 0.33)
        release.wait(10)
        raise RuntimeError("stopped by the test")

    app = MkcodeApp(
        Settings(model="/models/north-mini-code"),
        cwd=Path("/workspace/project"),
        store=store,
        backend_factory=slow_factory,
    )
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(100):
            await pilot.pause(0.02)
            if isinstance(app.screen, StartScreen) and "weights" in str(
                app.screen.query_one("#stage").render()
            ):
                break
        await pilot.pause(0.2)
        assert_snapshot(app, "start_80x24")
        release.set()
        await asyncio.sleep(0.05)
