"""The approval prompt: what the tool wants to do (the diff or the command) and three answers.

Keys: y / Enter allow once, a allow always (remembers the suggested rule), n / Esc deny. A command
that would leave the sandbox cannot be allowed "always" (the tools package never remembers it).
Everything shown comes from the model, so it is shown terminal-safe: an escape sequence or a bidi
override in a diff or a command is displayed as a marker, never acted on or hidden.
"""

from __future__ import annotations

from typing import ClassVar

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from mkcode.app.core.toolview import safe_syntax, safe_text, tool_title
from mkcode.tools import ApprovalRequest, Decision


class ApprovalScreen(ModalScreen[Decision]):
    DEFAULT_CSS = """
    ApprovalScreen { align: center middle; }
    ApprovalScreen > Vertical {
        width: 90%;
        max-width: 120;
        height: auto;
        max-height: 90%;
        border: thick $warning;
        background: $surface;
        padding: 0 1;
    }
    ApprovalScreen .title { text-style: bold; height: auto; }
    ApprovalScreen .reason { color: $text-muted; height: auto; }
    ApprovalScreen .danger { color: $error; text-style: bold; height: auto; }
    ApprovalScreen VerticalScroll { height: auto; max-height: 24; border: round $panel-lighten-2; }
    ApprovalScreen Horizontal { height: auto; align: center middle; }
    ApprovalScreen Button { margin: 0 1; min-width: 16; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,enter", "answer('allow_once')", "allow once", show=False),
        Binding("a", "answer('allow_always')", "always", show=False),
        Binding("n,escape", "answer('deny')", "deny", show=False),
        Binding("left", "app.focus_previous", show=False),
        Binding("right", "app.focus_next", show=False),
    ]

    def __init__(self, request: ApprovalRequest) -> None:
        super().__init__()
        self.request = request

    def compose(self) -> ComposeResult:
        r = self.request
        with Vertical():
            yield Static(Text(f"Allow {tool_title(r.tool, r.args)}?"), classes="title")
            yield Static(safe_text(r.reason), classes="reason")
            if r.unsandboxed:
                yield Static("This runs OUTSIDE the sandbox, with your full permissions.", classes="danger")
            with VerticalScroll():
                yield Static(self._preview())
            with Horizontal():
                yield Button("Allow once (y)", id="allow_once", variant="success")
                always = safe_text("Always (a)")
                if r.suggested_rule is not None:
                    always = safe_text(f"Always (a): {r.suggested_rule.describe()}")
                yield Button(always, id="allow_always", variant="primary", disabled=r.unsandboxed)
                yield Button("Deny (n)", id="deny", variant="error")

    def _preview(self) -> Syntax | Text:
        r = self.request
        if r.kind == "edit" and r.preview:
            dark = "light" not in str(self.app.theme)
            return safe_syntax(
                r.preview.rstrip("\n"),
                "diff",
                theme="ansi_dark" if dark else "ansi_light",
                word_wrap=True,
                background_color="default",
            )
        if r.kind == "shell":
            return safe_syntax(
                str(r.args.get("command", r.preview)), "bash", word_wrap=True, background_color="default"
            )
        return safe_text(r.preview or str(r.args))

    def on_mount(self) -> None:
        self.query_one("#allow_once", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_answer(event.button.id or "deny")

    def action_answer(self, value: str) -> None:
        decision = Decision(value)
        if decision is Decision.ALLOW_ALWAYS and self.request.unsandboxed:
            return
        self.dismiss(decision)
