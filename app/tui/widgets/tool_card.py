"""One tool call in the transcript: a header line with its state, and the part worth seeing.

States: running (…), waiting for approval (?), finished (✓), failed (✗), denied (⊘),
interrupted (■). Edits show their diff with syntax highlighting; shell commands show the tail of
their output; reads show only the header (the model read it, the user rarely needs to). Output and
diffs are shown terminal-safe (`safe_text` / `safe_syntax`).
"""

from __future__ import annotations

from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from mkcode.app.agent import ToolCallFinished
from mkcode.app.core.toolview import is_shell, output_excerpt, safe_syntax, safe_text, tool_title

SHOW_DURATION_S = 2.0  # shorter calls are not worth the noise
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
        self._header = Static(classes="tool-header")
        self._body = Static(classes="tool-body")
        self._body.display = False

    def compose(self) -> ComposeResult:
        yield self._header
        yield self._body

    def on_mount(self) -> None:
        self._render_header()

    def _render_header(self, detail: str = "") -> None:
        header = Text()
        header.append(f"{ICONS[self.state]} ", style="bold")
        header.append(tool_title(self.tool_name, self.arguments))
        if detail:
            header.append(f"  {detail}", style="dim")
        self._header.update(header)
        for state in ICONS:
            self.set_class(state == self.state, f"-{state}")

    def set_waiting(self) -> None:
        self.state = "waiting"
        self._render_header("waiting for approval")

    def finish(self, ev: ToolCallFinished) -> None:
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

    def show_body(self, ok: bool, output: str, diff: str | None) -> None:
        dark = "light" not in str(getattr(self.app, "theme", ""))
        if diff and ok:
            self._body.update(diff_renderable(diff, "ansi_dark" if dark else "ansi_light"))
        elif is_shell(self.tool_name) or not ok:
            excerpt = output_excerpt(output)
            if not excerpt:
                return
            self._body.update(safe_text(excerpt))
        else:
            return
        self._body.display = True
