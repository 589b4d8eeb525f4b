"""Small transcript entries: the user's prompt, notices, errors and command output (shown
terminal-safe: a prompt or session replayed from disk, an error or a diff may hold control codes)."""

from __future__ import annotations

from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import Static

from mkcode.app.core.toolview import safe_syntax, safe_text


class UserPrompt(Static):
    DEFAULT_CSS = """
    UserPrompt {
        margin: 1 0 1 0;
        padding: 0 1;
        background: $boost;
        border-left: thick $primary;
    }
    """

    def __init__(self, text: str) -> None:
        super().__init__(safe_text(text), classes="user-prompt")
        self.text = text


class Note(Static):
    """A notice, an error, or what a slash command printed."""

    DEFAULT_CSS = """
    Note { margin: 0 0 1 2; color: $text-muted; }
    Note.-error { color: $error; }
    Note.-warning { color: $warning; }
    Note.-help { color: $text; }
    """

    def __init__(self, text: str, kind: str = "info") -> None:
        body: Text | Syntax
        if kind == "diff":
            body = safe_syntax(text.rstrip("\n"), "diff", theme="ansi_dark", background_color="default")
        else:
            body = safe_text(text)
        super().__init__(body, classes=f"-{kind}")
        self.text = text
