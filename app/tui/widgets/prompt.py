"""The multi-line prompt: Enter sends, Shift+Enter / Ctrl+J / a trailing backslash add a line,
Up/Down walk the history from the first/last line, and completion keys go to the screen while its
completion list is open.

Typed characters are inserted in batches: a printable key is buffered and the buffer is inserted
by a callback queued behind the keys already waiting, so a paste the terminal delivers as keys (no
bracketed paste: tens of thousands of them) costs one insert (one re-wrap, one `Changed`) per
batch instead of one per character, which was quadratic (a 54 KB paste ran for minutes). Within a
burst (a key less than BURST_S after the last insert) the callback waits BURST_S: tmux delivers such
a paste ~32 keys at a time, and each insert re-wraps the whole line (Textual's wrap is linear in
it), so one insert per read was still quadratic (~25 s for 54 KB on a 2-core machine); typing at
human speed inserts each key at once. Any other key inserts the buffer first, so the order of keys
is kept."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from mkcode.app.core.prompt_history import PromptHistory

NEWLINE_KEYS = ("shift+enter", "ctrl+j", "alt+enter")
COMPLETION_KEYS = ("up", "down", "tab", "enter", "escape")
BURST_S = 0.05  # seconds: a typed key this soon after an insert is part of a burst (a paste as keys)


class PromptInput(TextArea):
    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 12;
        border: round $primary;
        padding: 0 1;
    }
    PromptInput:focus { border: round $accent; }
    PromptInput.-busy { border: round $secondary; }
    """

    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class CompletionKey(Message):
        key: str

    def __init__(self, history: PromptHistory, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.prompt_history = history
        self._history_index: int | None = None  # None: editing a new prompt
        self._draft = ""
        self.completion_open = False
        self._typed: list[str] = []  # printable keys not inserted yet
        self._inserted_at = -1.0  # time.monotonic() of the last insert of typed keys

    def take_typed(self, character: str) -> None:
        """A typed character: inserted with the others that arrive before the next callback (in a
        burst: within the next BURST_S)."""
        self._typed.append(character)
        if len(self._typed) == 1:
            if time.monotonic() - self._inserted_at < BURST_S:
                self.set_timer(BURST_S, self.flush_typed)
            else:
                self.call_later(self.flush_typed)

    def flush_typed(self) -> None:
        """Insert the typed keys not inserted yet (the app calls it before any other key, since a
        binding above the prompt may act on its text)."""
        if self._typed:
            text, self._typed = "".join(self._typed), []
            self.replace(text, *self.selection, maintain_selection_offset=False)  # as typing does
            self.scroll_cursor_visible()
            self._inserted_at = time.monotonic()

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character and not self.read_only:
            self._consume(event)
            self.take_typed(event.character)
            return
        self.flush_typed()
        if self.completion_open and event.key in COMPLETION_KEYS:
            self._consume(event)
            self.post_message(self.CompletionKey(event.key))
            return
        if event.key in NEWLINE_KEYS:
            self._consume(event)
            self.insert("\n")
            return
        if event.key == "enter":
            self._consume(event)
            self._submit_or_continue()
            return
        if event.key == "up" and self.cursor_location[0] == 0 and self._walk_history(-1):
            self._consume(event)
            return
        last_row = self.cursor_location[0] == self.document.line_count - 1
        if event.key == "down" and last_row and self._walk_history(+1):
            self._consume(event)
            return
        await super()._on_key(event)

    @staticmethod
    def _consume(event: events.Key) -> None:
        event.prevent_default()
        event.stop()

    def _submit_or_continue(self) -> None:
        row, col = self.cursor_location
        line = self.document.get_line(row)
        if col == len(line) and line.endswith("\\"):  # "foo\" + Enter: a new line, not a submit
            self.delete((row, col - 1), (row, col))
            self.insert("\n")
            return
        text = self.text.strip()
        if not text:
            return
        self.prompt_history.append(text)
        self._history_index = None
        self.clear()
        self.post_message(self.Submitted(text))

    def _walk_history(self, step: int) -> bool:
        entries = self.prompt_history.entries
        if not entries:
            return False
        if self._history_index is None:
            if step > 0:
                return False
            self._draft = self.text
            index = len(entries) - 1
        else:
            index = self._history_index + step
        if index >= len(entries):
            self._history_index = None
            self._set(self._draft)
            return True
        if index < 0:
            return True  # at the oldest entry: stay
        self._history_index = index
        self._set(entries[index])
        return True

    def _set(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    def replace_fragment(self, fragment_len: int, replacement: str) -> None:
        """Replace the `fragment_len` characters before the cursor (completion)."""
        row, col = self.cursor_location
        start = (row, max(0, col - fragment_len))
        self.replace(replacement, start, (row, col))
