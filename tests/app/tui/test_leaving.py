"""Leaving the TUI: Ctrl+C or Esc while the model loads quits at once with 130 even though the load
cannot be stopped; a model that cannot load is shown and the app exits 1."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from mkcode.app.core.backend import BackendError
from mkcode.app.settings import Settings
from mkcode.app.tui.app import MkcodeApp
from mkcode.app.tui.screens.start import StartScreen

pytestmark = pytest.mark.asyncio


def _app(store, factory) -> MkcodeApp:
    return MkcodeApp(Settings(model="/models/x"), cwd=Path("/tmp"), store=store, backend_factory=factory)


async def _wait_stage(pilot, app, text: str) -> None:
    for _ in range(200):
        await pilot.pause(0.02)
        if isinstance(app.screen, StartScreen) and text in str(app.screen.query_one("#stage").render()):
            return
    pytest.fail(f"stage {text!r} never shown")


@pytest.mark.parametrize("key", ["ctrl+c", "escape"])
async def test_interrupt_while_loading_quits_at_once(store, key):
    release = threading.Event()
    loaded = threading.Event()

    def stuck(settings, progress):
        progress("loading weights", 0.3)
        release.wait(30)  # a load that does not end while the user waits
        loaded.set()
        raise BackendError("never mind")

    app = _app(store, stuck)
    t0 = time.monotonic()
    async with app.run_test(size=(80, 24)) as pilot:
        await _wait_stage(pilot, app, "loading weights")
        await pilot.press(key)
        await pilot.pause(0.1)
        assert not app.is_running
    assert time.monotonic() - t0 < 5
    assert app.return_code == 130 and app.loader_running  # the loader is left to process_exit
    release.set()
    assert loaded.wait(5)


async def test_a_model_that_cannot_load_exits_1(store):
    def broken(settings, progress):
        raise BackendError("/models/x is not a checkpoint directory")

    app = _app(store, broken)
    async with app.run_test(size=(80, 24)) as pilot:
        await _wait_stage(pilot, app, "could not start")
        assert "not a checkpoint directory" in str(app.screen.query_one("#error").render())
        await pilot.press("escape")
        await pilot.pause(0.1)
    assert app.return_code == 1 and "not a checkpoint" in (app.load_error or "")
