"""The model's reasoning: collapsed by default, one line saying how much there is; shown
terminal-safe."""

from __future__ import annotations

from textual.widgets import Collapsible, Static

from mkcode.app.tui.core.toolview import safe_text


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
        self._body = Static(safe_text(text))
        super().__init__(self._body, title=self._heading(done), collapsed=True)

    def _heading(self, done: bool) -> str:
        words = len(self.text.split())
        return f"Thought ({words} words)" if done else f"Thinking… ({words} words)"

    def append(self, fragment: str) -> None:
        self.text += fragment
        self._body.update(safe_text(self.text))
        self.title = self._heading(False)

    def finish(self) -> None:
        self.title = self._heading(True)
