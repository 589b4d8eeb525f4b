"""The start screen: what is loading, a progress bar, and where mkcode is working."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import ProgressBar, Static

from mkcode.app.core.toolview import safe_text

LOGO = "mkcode"


class StartScreen(Screen[None]):
    DEFAULT_CSS = """
    StartScreen { align: center middle; }
    StartScreen > Vertical { width: 72; max-width: 95%; height: auto; }
    StartScreen .logo { text-style: bold; color: $accent; text-align: center; width: 100%; }
    StartScreen .where { color: $text-muted; text-align: center; width: 100%; margin-bottom: 1; }
    StartScreen .stage { text-align: center; width: 100%; height: auto; }
    StartScreen .error { color: $error; text-align: center; width: 100%; height: auto; }
    StartScreen ProgressBar { width: auto; margin-top: 1; }
    StartScreen Center { height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+c,ctrl+q,escape", "leave", "quit", priority=True),
    ]

    def __init__(self, workspace: str, model: str) -> None:
        super().__init__()
        self.workspace = workspace
        self.model = model
        self.failed = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(LOGO, classes="logo")
            yield Static(safe_text(str(self.workspace)), classes="where")
            yield Static(f"starting {self.model}…", classes="stage", id="stage")
            with Center():
                yield ProgressBar(total=1.0, show_eta=False, id="progress")
            yield Static("", classes="error", id="error")

    def show_progress(self, stage: str, fraction: float | None) -> None:
        self.query_one("#stage", Static).update(stage)
        bar = self.query_one("#progress", ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=fraction)

    def action_leave(self) -> None:
        """Quit while loading (an interrupt: 130), or after the load failed (exit 1)."""
        if self.failed:
            self.app.action_quit_failed()  # type: ignore[attr-defined]
        else:
            self.app.action_quit_interrupted()  # type: ignore[attr-defined]

    def show_error(self, error: str) -> None:
        self.failed = True
        self.query_one("#stage", Static).update("could not start")
        self.query_one("#error", Static).update(safe_text(f"{error}\n\nPress Esc to quit."))
        self.query_one("#progress", ProgressBar).display = False
