"""Tool cards show what every tool returned (first lines, collapsed; click or Ctrl+O expands) and a
running call shows its elapsed time, also after its approval."""

from __future__ import annotations

import pytest

from mkcode.app.tui.widgets.tool_card import COLLAPSED_LINES, ToolCard
from tests.app.tui.scripted_engine import text_step, tool_step

pytestmark = pytest.mark.asyncio


async def _settle(pilot, app) -> None:
    for _ in range(200):
        await pilot.pause(0.02)
        if not app.conversation.busy:
            break
    await app.workers.wait_for_complete()
    await pilot.pause(0.05)


def _body(card: ToolCard) -> str:
    return str(card._body.render())


async def _run(pilot, app, text: str) -> None:
    prompt = app.screen.query_one("#prompt")
    prompt.text = text
    await pilot.press("end", "enter")
    await _settle(pilot, app)


async def test_read_and_list_cards_show_their_output(make_app, workspace):
    (workspace / "notes.txt").write_text("remember the milk\n")
    steps = [
        tool_step("list_dir", {"path": "."}),
        tool_step("read_file", {"path": "notes.txt"}),
        text_step("There are greet.py and notes.txt."),
    ]
    app = make_app(steps)
    async with app.run_test(size=(100, 40)) as pilot:
        await _run(pilot, app, "what is here?")
        listing, read = app.screen.query(ToolCard)
        assert listing._body.display and "greet.py" in _body(listing) and "notes.txt" in _body(listing)
        assert read._body.display and "remember the milk" in _body(read)


async def test_long_output_is_collapsed_and_expands(make_app, workspace):
    (workspace / "long.txt").write_text("".join(f"line {i}\n" for i in range(40)))
    app = make_app([tool_step("read_file", {"path": "long.txt"}), text_step("Read it.")])
    async with app.run_test(size=(100, 40)) as pilot:
        await _run(pilot, app, "read long.txt")
        card = app.screen.query_one(ToolCard)
        shown = _body(card)
        assert "line 0" in shown and f"line {COLLAPSED_LINES + 5}" not in shown
        assert "more lines" in shown and card.collapsible and not card.expanded
        await pilot.press("ctrl+o")
        await pilot.pause(0.05)
        assert card.expanded and "line 39" in _body(card)
        await pilot.press("ctrl+o")
        await pilot.pause(0.05)
        assert not card.expanded and "line 39" not in _body(card)


async def test_failed_call_shows_the_error(make_app):
    app = make_app([tool_step("read_file", {"path": "missing.txt"}), text_step("It is not there.")])
    async with app.run_test(size=(100, 30)) as pilot:
        await _run(pilot, app, "read missing.txt")
        card = app.screen.query_one(ToolCard)
        assert card.state == "failed" and "missing.txt" in _body(card)


async def test_running_card_shows_elapsed_time_after_approval(make_app):
    app = make_app([])
    async with app.run_test(size=(100, 30)) as pilot:
        card = ToolCard("c1", "run_shell", {"command": "sleep 5"})
        await app.screen.transcript.mount(card)
        card.set_waiting()
        assert card.state == "waiting" and "waiting for approval" in str(card._header.render())
        card.set_running()
        card._started -= 3.2  # as if it had run for three seconds
        card._tick()
        await pilot.pause(0.05)
        header = str(card._header.render())
        assert card.state == "running" and "running 3s" in header and header.startswith("…")
