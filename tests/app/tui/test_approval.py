"""The approval dialog answers only deliberate keys: type-ahead goes back to the prompt, a letter
followed by more typing is text, Enter needs a button focused on purpose, and "always" shows its
rule and asks again before it is granted. The guard interval is real here (short, for speed)."""

from __future__ import annotations

import asyncio

import pytest

import mkcode.app.tui.screens.approval as approval
from mkcode.app.tui.screens.approval import ApprovalScreen
from mkcode.app.tui.widgets.tool_card import ToolCard
from tests.app.tui.scripted_engine import text_step, tool_step

pytestmark = pytest.mark.asyncio

GUARD = 0.3
EDIT = {"path": "greet.py", "old_string": '"hello"', "new_string": '"hello, world"'}


@pytest.fixture(autouse=True)
def real_guard(monkeypatch):
    monkeypatch.setattr(approval, "GUARD_S", GUARD)


async def _open_approval(pilot, app) -> ApprovalScreen:
    prompt = app.screen.query_one("#prompt")
    prompt.text = "edit it"
    await pilot.press("end", "enter")
    for _ in range(200):
        await pilot.pause(0.02)
        if isinstance(app.screen, ApprovalScreen):
            return app.screen
    pytest.fail("no approval dialog")


async def _settle(pilot, app) -> None:
    for _ in range(200):
        await pilot.pause(0.02)
        if not app.conversation.busy and not isinstance(app.screen, ApprovalScreen):
            break
    # A turn still waiting on an approval would make wait_for_complete() wait forever: fail instead.
    assert not isinstance(app.screen, ApprovalScreen), "an approval is still open"
    await asyncio.wait_for(app.workers.wait_for_complete(), timeout=30)
    await pilot.pause(0.05)


async def test_type_ahead_goes_to_the_prompt_and_grants_nothing(make_app, workspace):
    app = make_app([tool_step("edit_file", EDIT), text_step("ok")])
    async with app.run_test(size=(100, 30)) as pilot:
        modal = await _open_approval(pilot, app)
        await pilot.press(*"can you", "enter")  # typed on, as if the dialog were not there
        await pilot.pause(GUARD * 3)
        assert app.screen is modal  # still asking: nothing was answered
        chat = app.screen_stack[-2]
        assert chat.prompt.text.endswith("can you")  # the characters were not lost
        assert '"hello"' in (workspace / "greet.py").read_text()
        assert not app.conversation.policy.rules
        await pilot.press("n")  # a deliberate answer after a quiet moment
        await pilot.pause(GUARD * 2)
        await _settle(pilot, app)
        assert app.screen.query_one(ToolCard).state == "denied"
        assert not app.conversation.policy.rules
    assert '"hello"' in (workspace / "greet.py").read_text()


async def test_a_letter_followed_by_typing_is_text(make_app, workspace):
    app = make_app([tool_step("edit_file", EDIT), text_step("ok")])
    async with app.run_test(size=(100, 30)) as pilot:
        modal = await _open_approval(pilot, app)
        await pilot.pause(GUARD * 2)
        await pilot.press("a", "n", "d")  # "and": neither "a" (always) nor "n" (deny) counts
        await pilot.pause(GUARD * 3)
        assert app.screen is modal and not modal.confirming
        assert app.screen_stack[-2].prompt.text.endswith("and")
        await pilot.press("escape")
        await _settle(pilot, app)
    assert not app.conversation.policy.rules


async def test_enter_needs_a_deliberately_focused_button(make_app, workspace):
    app = make_app([tool_step("edit_file", EDIT), text_step("ok")])
    async with app.run_test(size=(100, 30)) as pilot:
        modal = await _open_approval(pilot, app)
        await pilot.pause(GUARD * 2)
        await pilot.press("enter")  # nothing is focused: no default answer
        await pilot.pause(GUARD)
        assert app.screen is modal
        await pilot.press("tab", "enter")  # "Allow once" focused on purpose, then pressed
        await _settle(pilot, app)
        assert app.screen.query_one(ToolCard).state == "ok"
    assert '"hello, world"' in (workspace / "greet.py").read_text()


async def test_always_shows_the_rule_and_asks_again(make_app, workspace):
    app = make_app([tool_step("edit_file", EDIT), text_step("ok")])
    async with app.run_test(size=(100, 30)) as pilot:
        modal = await _open_approval(pilot, app)
        await pilot.pause(GUARD * 2)
        await pilot.press("a")
        await pilot.pause(GUARD * 2)
        assert modal.confirming and app.screen is modal  # not granted yet
        rule = str(modal.query_one("#rule").render())
        assert modal.request.suggested_rule.describe() in rule
        assert not app.conversation.policy.rules
        await pilot.press("escape")  # back to the three answers, still nothing granted
        await pilot.pause(GUARD * 2)
        assert not modal.confirming and app.screen is modal
        await pilot.press("a")
        await pilot.pause(GUARD * 2)
        await pilot.press("y")
        await pilot.pause(GUARD * 2)
        await _settle(pilot, app)
        assert len(app.conversation.policy.rules) == 1
    assert '"hello, world"' in (workspace / "greet.py").read_text()
