"""The approval prompt: what the tool wants to do (the diff or the command) and three answers.

Answers are deliberate, never a side effect of typing:

- Keys that arrive while the user is still typing are not answers. A key counts as typing when it
  comes within `guard_s` of the dialog (or its confirmation step) appearing, or of a typed
  character before it. Typed characters go back to the prompt input (the `type_ahead` callback),
  so nothing is lost; a typed Enter is dropped.
- A letter answer (y once, a always, n deny) takes effect only when no other key follows it
  within `guard_s`: the "a" of "can you" becomes text in the input, never a grant.
- Enter does nothing until a button has been focused with Tab / ← / → after the guard; then it
  presses that button. Nothing is focused when the dialog opens. A click counts after the guard.
- "Always" is two steps: the first shows the exact rule that would be remembered, and only a
  second deliberate answer (y, or the focused button + Enter) grants it. A command that would leave
  the sandbox, or one for which no rule can be stated, cannot be allowed "always".
- Esc or Ctrl+C deny at once (denying never grants anything); Ctrl+C also asks to interrupt the turn.

Everything shown comes from the model, so it is shown terminal-safe: an escape sequence or a bidi
override in a diff or a command is displayed as a marker, never acted on or hidden.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.syntax import Syntax
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Static

from mkcode.app.core.toolview import safe_syntax, safe_text, tool_title
from mkcode.tools import ApprovalRequest, Decision

GUARD_S = 0.6  # quiet time that separates a deliberate key from typing
LETTERS = {"y": "allow_once", "a": "allow_always", "n": "deny"}
CONFIRM_LETTERS = {"y": "confirm_always"}
FOCUS_KEYS = ("tab", "shift+tab", "left", "right")
ANSWER_HINT = "y allow once · a always (shows the rule, asks again) · n or Esc deny · Tab to a button, Enter"


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
    ApprovalScreen .rule { color: $warning; text-style: bold; height: auto; }
    ApprovalScreen .hint { color: $text-muted; height: auto; text-align: center; width: 100%; }
    ApprovalScreen VerticalScroll { height: auto; max-height: 24; border: round $panel-lighten-2; }
    ApprovalScreen Horizontal { height: auto; align: center middle; }
    ApprovalScreen Button { margin: 0 1; min-width: 16; }
    ApprovalScreen #confirm { display: none; }
    ApprovalScreen.-confirming #answers { display: none; }
    ApprovalScreen.-confirming #confirm { display: block; }
    """
    AUTO_FOCUS = None  # nothing focused: Enter has no default answer

    def __init__(
        self,
        request: ApprovalRequest,
        *,
        type_ahead: Callable[[str], None] | None = None,
        guard_s: float | None = None,
    ) -> None:
        super().__init__()
        self.request = request
        self.type_ahead = type_ahead
        self.guard_s = GUARD_S if guard_s is None else guard_s
        self.confirming = False
        self.interrupt_requested = False  # Ctrl+C: deny, and the chat screen interrupts the turn
        self._quiet_since = time.monotonic()  # reset when the dialog / a step appears, and per key
        self._deliberate_focus = False
        self._pending: tuple[str, str] | None = None  # (action, character) waiting for quiet
        self._pending_timer: Timer | None = None

    @property
    def can_always(self) -> bool:
        r = self.request
        return not r.unsandboxed and r.suggested_rule is not None

    def compose(self) -> ComposeResult:
        r = self.request
        with Vertical():
            yield Static(Text(f"Allow {tool_title(r.tool, r.args)}?"), classes="title")
            yield Static(safe_text(r.reason), classes="reason")
            if r.unsandboxed:
                yield Static("This runs OUTSIDE the sandbox, with your full permissions.", classes="danger")
            with VerticalScroll():
                yield Static(self._preview())
            with Horizontal(id="answers"):
                yield Button("Allow once (y)", id="allow_once", variant="success")
                always = safe_text("Always (a)")
                if r.suggested_rule is not None:
                    always = safe_text(f"Always (a): {r.suggested_rule.describe()}")
                yield Button(always, id="allow_always", variant="primary", disabled=not self.can_always)
                yield Button("Deny (n)", id="deny", variant="error")
            with Vertical(id="confirm"):
                rule = r.suggested_rule.describe() if r.suggested_rule is not None else ""
                yield Static(
                    safe_text(f"Always allow {rule} for the rest of this session, without asking?"),
                    classes="rule",
                    id="rule",
                )
                with Horizontal():
                    yield Button("Yes, always (y)", id="confirm_always", variant="warning")
                    yield Button("Back (Esc)", id="back")
            yield Static(ANSWER_HINT, classes="hint", id="hint")

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
        self._quiet_since = time.monotonic()
        self.set_focus(None)

    # -- keys ------------------------------------------------------------------------------------

    def _hint(self, text: str) -> None:
        self.query_one("#hint", Static).update(text)

    def _typing(self, now: float) -> bool:
        return now - self._quiet_since < self.guard_s

    def _give_back(self, character: str | None) -> None:
        if character and self.type_ahead is not None:
            self.type_ahead(character)

    def _flush_pending(self) -> None:
        """A letter answer followed by another key was typing: its character goes to the input."""
        if self._pending_timer is not None:
            self._pending_timer.stop()
            self._pending_timer = None
        if self._pending is not None:
            self._give_back(self._pending[1])
            self._pending = None

    async def on_key(self, event: events.Key) -> None:
        event.stop()
        event.prevent_default()  # no binding (not even a focused button's Enter) acts on its own
        now = time.monotonic()
        key = event.key
        if key in ("escape", "ctrl+c"):
            self._flush_pending()
            if key == "escape" and self.confirming:
                self._show_confirm(False)
                return
            self.interrupt_requested = key == "ctrl+c"
            self.dismiss(Decision.DENY)
            return
        typing = self._typing(now) or self._pending is not None
        if typing or event.is_printable:  # a burst of typing goes on; Tab then Enter is not one
            self._quiet_since = now
        if typing:
            self._flush_pending()
            self._give_back(event.character if event.is_printable else None)
            if self._deliberate_focus:
                self._deliberate_focus = False
                self.set_focus(None)
            self._hint("keys typed while the dialog opened went to the prompt · answer with y / a / n")
            return
        if key in FOCUS_KEYS:
            self._move_focus(-1 if key in ("shift+tab", "left") else 1)
            return
        if key == "enter":
            focused = self.focused
            if isinstance(focused, Button) and self._deliberate_focus and not focused.disabled:
                self._act(focused.id or "deny")
            else:
                self._hint("press y / a / n, or Tab to a button and Enter")
            return
        letters = CONFIRM_LETTERS if self.confirming else LETTERS
        action = letters.get(event.character or "")
        if action is None:
            self._give_back(event.character if event.is_printable else None)
            return
        self._pending = (action, event.character or "")
        if self.guard_s <= 0:  # no guard (tests): Textual cannot run a zero-interval timer
            self._commit_pending()
            return
        self._pending_timer = self.set_timer(self.guard_s, self._commit_pending)

    def _commit_pending(self) -> None:
        pending, self._pending, self._pending_timer = self._pending, None, None
        if pending is not None:
            self._act(pending[0])

    def _move_focus(self, step: int) -> None:
        container = "#confirm" if self.confirming else "#answers"
        buttons = [b for b in self.query_one(container).query(Button) if not b.disabled]
        if not buttons:
            return
        current = self.focused
        index = buttons.index(current) + step if current in buttons else (0 if step > 0 else -1)
        buttons[index % len(buttons)].focus()
        self._deliberate_focus = True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if self._typing(time.monotonic()):  # a click that raced the dialog's appearance
            return
        self._act(event.button.id or "deny")

    # -- answers ---------------------------------------------------------------------------------

    def _act(self, action: str) -> None:
        if action == "allow_once":
            self.dismiss(Decision.ALLOW_ONCE)
        elif action == "deny":
            self.dismiss(Decision.DENY)
        elif action == "allow_always":
            if self.can_always:
                self._show_confirm(True)
            else:
                self._hint("this call cannot be allowed always")
        elif action == "confirm_always" and self.confirming and self.can_always:
            self.dismiss(Decision.ALLOW_ALWAYS)
        elif action == "back":
            self._show_confirm(False)

    def _show_confirm(self, on: bool) -> None:
        self.confirming = on
        self.set_class(on, "-confirming")
        self._quiet_since = time.monotonic()  # the new step has its own guard
        self._deliberate_focus = False
        self.set_focus(None)
        self._hint("y confirms · Esc goes back" if on else ANSWER_HINT)
