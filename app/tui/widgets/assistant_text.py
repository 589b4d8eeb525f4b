"""The assistant's answer, streamed as Markdown.

Deltas are coalesced: `add_fragment()` only buffers, and a 50 ms timer hands what accumulated to Textual's
`MarkdownStream`, which re-parses only the last block. The whole reply is never re-rendered per
token. `finish()` flushes and renders the final text once with `update()`, so fenced code that was
highlighted mid-stream ends up highlighted from the complete source. What reaches the Markdown
parser is `terminal_safe` (control and bidi characters shown escaped); `text` keeps the model's own.
"""

from __future__ import annotations

from textual.timer import Timer
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownStream

from mkcode.tools.text import TerminalStream, terminal_safe

FLUSH_INTERVAL_S = 0.05


class AssistantText(Markdown):
    DEFAULT_CSS = """
    AssistantText {
        margin: 0 0 1 2;
        padding: 0;
        background: transparent;
    }
    """

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(terminal_safe(text), **kwargs)
        self.text = text
        self._safe = TerminalStream()
        self._pending: list[str] = []
        self._stream: MarkdownStream | None = None
        self._timer: Timer | None = None
        self.finished = False

    def add_fragment(self, fragment: str) -> None:
        """Buffer a delta; it is written on the next flush tick."""
        self.text += fragment
        self._pending.append(fragment)
        if self._timer is None:
            self._timer = self.set_interval(FLUSH_INTERVAL_S, self._flush)

    async def _flush(self) -> None:
        if not self._pending:
            return
        chunk = self._safe.feed("".join(self._pending))
        self._pending.clear()
        if not chunk:  # held back until the next delta says what it is (a CR before LF, ...)
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self)
        await self._stream.write(chunk)

    async def finish(self) -> None:
        """Stop streaming and render the complete text once."""
        if self.finished:
            return
        self.finished = True
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._pending.clear()
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        await self.update(terminal_safe(self.text))
