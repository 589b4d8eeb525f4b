"""Fixtures for the TUI tests: a workspace, a session store and an app on the scripted engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from mkcode.app.core.sessions import SessionStore
from mkcode.app.settings import Settings
from mkcode.app.tui.app import MkcodeApp
from tests.app.tui.scripted_engine import scripted_backend


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "greet.py").write_text('def greet():\n    return "hello"\n')
    return ws


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "data")


@pytest.fixture
def make_app(workspace: Path, store: SessionStore):
    def make(steps, **kwargs) -> MkcodeApp:
        settings = kwargs.pop("settings", None) or Settings()
        backend = kwargs.pop("backend", None) or scripted_backend(steps)
        return MkcodeApp(settings, cwd=workspace, store=store, backend=backend, **kwargs)

    return make


@pytest.fixture(autouse=True)
def no_approval_guard(monkeypatch):
    """Flow tests answer approvals at once; the guard itself is tested with its own interval."""
    import mkcode.app.tui.screens.approval as approval

    monkeypatch.setattr(approval, "GUARD_S", 0.0)
