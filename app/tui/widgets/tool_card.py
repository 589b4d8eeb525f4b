"""One tool call in the transcript: a header line with its state, and what the tool returned.

States: running (…, with the elapsed time once it passes a second), waiting for approval (?),
finished (✓), failed (✗), denied (⊘), interrupted (■). After an approval the card goes back to
running, so a long command shows that it is working.

Every tool's result is shown, so an answer can be checked against what the tool really returned:
edits show their diff; everything else shows its output, collapsed to its first lines (the last
lines for shell commands and failures, where errors are) with a "more lines" marker; a click (or
Ctrl+O on the chat screen) expands it. Output and diffs are shown terminal-safe (`safe_text` /
`safe_syntax`).
"""

from __future__ import annotations

import time
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.timer import Timer
from textual.widgets import Static

from mkcode.app.agent import ToolCallFinished
from mkcode.app.core.toolview import (
    is_shell,
    output_excerpt,
    output_head,
    safe_syntax,
    safe_text,
    tool_title,
)

SHOW_DURATION_S = 2.0  # shorter calls are not worth the noise
SHOW_ELAPSED_S = 1.0  # a running call shows its elapsed time after this
COLLAPSED_LINES = 6
EXPANDED_LINES = 400
ICONS = {"running": "…", "waiting": "?", "ok": "✓", "failed": "✗", "denied": "⊘", "interrupted": "■"}


def diff_renderable(diff: str, theme: str = "ansi_dark") -> Syntax:
    return safe_syntax(diff.rstrip("\n"), "diff", theme=theme, word_wrap=True, background_color="default")


class ToolCard(Vertical):
    DEFAULT_CSS = """
    ToolCard {
        height: auto;
        margin: 0 0 1 2;
        padding: 0 1;
        border-left: thick $secondary;
    }
    ToolCard.-ok { border-left: thick $success; }
    ToolCard.-failed, ToolCard.-interrupted { border-left: thick $error; }
    ToolCard.-denied { border-left: thick $warning; }
    ToolCard.-waiting { border-left: thick $warning; }
    ToolCard > .tool-header { height: auto; }
    ToolCard > .tool-body { height: auto; max-height: 20; overflow-y: auto; color: $text-muted; }
    """

    def __init__(self, call_id: str, name: str, arguments: dict[str, Any] | str) -> None:
        super().__init__(id=f"tool-{call_id}")
        self.call_id = call_id
        self.tool_name = name
        self.arguments = arguments
        self.state = "running"
        self.expanded = False
        self.output = ""  # what the tool returned (shown collapsed or expanded)
        self._output_ok = True
        self._showing_diff = False
        self._started = time.monotonic()
        self._ticker: Timer | None = None
        self._header = Static(classes="tool-header")
        self._body = Static(classes="tool-body")
        self._body.display = False

    def compose(self) -> ComposeResult:
        yield self._header
        yield self._body

    def on_mount(self) -> None:
        self._render_header()
        if self.state == "running":
            self._tick()

    def _render_header(self, detail: str = "") -> None:
        header = Text()
        header.append(f"{ICONS[self.state]} ", style="bold")
        header.append(tool_title(self.tool_name, self.arguments))
        if detail:
            header.append(f"  {detail}", style="dim")
        self._header.update(header)
        for state in ICONS:
            self.set_class(state == self.state, f"-{state}")

    # -- running ---------------------------------------------------------------------------------

    def elapsed_text(self) -> str:
        elapsed = time.monotonic() - self._started
        return f"running {elapsed:.0f}s" if elapsed >= SHOW_ELAPSED_S else "running"

    def _tick(self) -> None:
        if self.state != "running":
            self._stop_ticker()
            return
        self._render_header(self.elapsed_text())
        if self._ticker is None and self.is_mounted:
            self._ticker = self.set_interval(1.0, self._tick)

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    def set_running(self) -> None:
        """Approved: the call runs now (the elapsed time counts from here)."""
        self.state = "running"
        self._started = time.monotonic()
        self._render_header("running")
        self._tick()

    def set_waiting(self) -> None:
        self.state = "waiting"
        self._stop_ticker()
        self._render_header("waiting for approval")

    def finish(self, ev: ToolCallFinished) -> None:
        self._stop_ticker()
        if ev.interrupted:
            self.state = "interrupted"
        elif ev.denied:
            self.state = "denied"
        else:
            self.state = "ok" if ev.ok else "failed"
        detail = f"{ev.duration_s:.1f}s" if ev.duration_s >= SHOW_DURATION_S else ""
        if ev.denied:
            detail = "denied"
        self._render_header(detail)
        self.show_body(ev.ok, ev.output, ev.diff)

    # -- the body --------------------------------------------------------------------------------

    def show_body(self, ok: bool, output: str, diff: str | None) -> None:
        dark = "light" not in str(getattr(self.app, "theme", ""))
        self.output = output
        self._output_ok = ok
        self._showing_diff = bool(diff and ok)
        if diff and ok:
            self._body.update(diff_renderable(diff, "ansi_dark" if dark else "ansi_light"))
        else:
            shown = self._shown_output()
            if not shown.plain.strip():
                return
            self._body.update(shown)
        self._body.display = True

    def _shown_output(self) -> Text:
        """The output as it is shown now: collapsed (first or last lines) or expanded."""
        output = self.output.rstrip("\n")
        limit = EXPANDED_LINES if self.expanded else COLLAPSED_LINES
        tail = is_shell(self.tool_name) or not self._output_ok
        excerpt = output_excerpt(output, limit) if tail else output_head(output, limit)
        text = safe_text(excerpt)
        hidden = output.count("\n") + 1 - limit
        if not self.expanded and hidden > 0 and output:
            text.append("\n▸ click or Ctrl+O to show all", style="dim italic")
        return text

    @property
    def collapsible(self) -> bool:
        if self._showing_diff or not self.output:
            return False
        return self.output.rstrip("\n").count("\n") + 1 > COLLAPSED_LINES

    def toggle(self) -> None:
        if not self.collapsible or self.state in ("running", "waiting"):
            return
        self.expanded = not self.expanded
        self._body.update(self._shown_output())

    def on_click(self, event: events.Click) -> None:
        if self.collapsible:
            event.stop()
            self.toggle()
