"""The model's reasoning: collapsed by default, one line saying how much there is; shown
terminal-safe."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Collapsible, Static

from mkcode.app.core.toolview import marked_text
from mkcode.tools.text import TerminalStream


class Reasoning(Collapsible):
    DEFAULT_CSS = """
    Reasoning {
        margin: 0 0 0 2;
        padding: 0;
        border: none;
        background: transparent;
        color: $text-muted;
    }
    Reasoning > Contents { padding: 0 0 0 2; }
    Reasoning Static { color: $text-muted; text-style: italic; }
    """

    def __init__(self, text: str = "", *, done: bool = False) -> None:
        self.text = text
        self._safe = TerminalStream()  # made safe piece by piece, not all of it again per delta
        self._shown = marked_text(self._safe.feed_marked(text))
        if done:
            self._shown.append_text(marked_text(self._safe.flush_marked()))
        self._body = Static(self._shown.copy())
        super().__init__(self._body, title=self._heading(done), collapsed=True)

    def _heading(self, done: bool) -> str:
        words = len(self.text.split())
        return f"Thought ({words} words)" if done else f"Thinking… ({words} words)"

    def append(self, fragment: str) -> None:
        self.text += fragment
        self._show(marked_text(self._safe.feed_marked(fragment)))
        self.title = self._heading(False)

    def finish(self) -> None:
        self._show(marked_text(self._safe.flush_marked()))
        self.title = self._heading(True)

    def _show(self, piece: Text) -> None:
        if piece.plain:
            self._shown.append_text(piece)
            self._body.update(self._shown.copy())
