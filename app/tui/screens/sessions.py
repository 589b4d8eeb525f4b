"""The session picker (`/sessions`, `--resume` without an ID): Enter resumes, Esc closes."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from mkcode.app.core.conversation import format_session
from mkcode.app.core.sessions import SessionInfo
from mkcode.app.core.toolview import safe_text


class SessionPicker(ModalScreen[str | None]):
    DEFAULT_CSS = """
    SessionPicker { align: center middle; }
    SessionPicker > Vertical {
        width: 90%; max-width: 110; height: auto; max-height: 80%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    SessionPicker .title { text-style: bold; }
    SessionPicker OptionList { height: auto; max-height: 20; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "close", show=False)]

    def __init__(self, sessions: list[SessionInfo], current: str | None = None) -> None:
        super().__init__()
        self.sessions = sessions
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Sessions in this directory (Enter resumes, Esc closes)", classes="title")
            options = [
                Option(safe_text(format_session(s, current=s.id == self.current)), id=s.id)
                for s in self.sessions
            ]
            yield OptionList(*options)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
