"""The chat screen: transcript, completion list, prompt and status bar, and the turn's life cycle.

Flow: the prompt posts `Submitted` → a slash command goes to `Conversation.command`; anything else
starts the turn worker, which posts one `AgentEventArrived` per agent event; the handlers below
stream text into the transcript, open tool cards, push the approval modal and finish the turn.
"""

from __future__ import annotations

import time
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import OptionList, TextArea
from textual.widgets.option_list import Option

from mkcode.app.agent import (
    AgentError,
    ApprovalRequested,
    Notice,
    ReasoningDelta,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
)
from mkcode.app.core import slash
from mkcode.app.core.conversation import CommandReply, Conversation
from mkcode.app.core.history import shown_items
from mkcode.app.core.mentions import mention_at_cursor
from mkcode.app.core.prompt_history import PromptHistory
from mkcode.app.core.toolview import safe_text
from mkcode.app.tui.messages import AgentEventArrived, TurnEnded
from mkcode.app.tui.screens.approval import ApprovalScreen
from mkcode.app.tui.screens.sessions import SessionPicker
from mkcode.app.tui.widgets.prompt import PromptInput
from mkcode.app.tui.widgets.status_bar import Status, StatusBar
from mkcode.app.tui.widgets.transcript import Transcript
from mkcode.tools import Decision

KEYS_HELP = (
    "Enter send · Shift+Enter/Ctrl+J newline · ↑/↓ history · Tab complete /commands and @files\n"
    "Esc or Ctrl+C interrupt · Ctrl+C twice quit · Ctrl+T theme · PgUp/PgDn scroll · "
    "Ctrl+O tool output"
)
QUIT_WINDOW_S = 2.0


class ChatScreen(Screen[None]):
    DEFAULT_CSS = """
    ChatScreen { layout: vertical; }
    ChatScreen #completions {
        height: auto; max-height: 8; display: none; border: round $panel-lighten-2; margin: 0 1;
    }
    ChatScreen #completions.-open { display: block; }
    ChatScreen PromptInput { margin: 0 1; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "interrupt", "interrupt", show=False),
        Binding("ctrl+c", "ctrl_c", "interrupt/quit", show=False, priority=True),
        Binding("ctrl+d", "quit", "quit", show=False),
        Binding("ctrl+o", "toggle_tool_output", "tool output", show=False),
        Binding("pageup", "scroll_transcript(-1)", show=False),
        Binding("pagedown", "scroll_transcript(1)", show=False),
    ]

    def __init__(self, conversation: Conversation, history: PromptHistory) -> None:
        super().__init__()
        self.conv = conversation
        self.history = history
        self._turn_started = 0.0
        self._turn_chars = 0
        self._turn_answered = False  # the current turn has written answer text (not only reasoning)
        self._last_ctrl_c = 0.0
        self._hint = ""
        self._approvals: dict[str, ApprovalScreen] = {}
        self._completion_fragment = ""

    # -- layout ----------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Transcript(id="transcript")
        yield OptionList(id="completions")
        yield PromptInput(self.history, id="prompt", placeholder="Ask mkcode…  (/help for commands)")
        yield StatusBar(id="status")

    @property
    def transcript(self) -> Transcript:
        return self.query_one("#transcript", Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def completions(self) -> OptionList:
        return self.query_one("#completions", OptionList)

    @property
    def status_bar(self) -> StatusBar:
        return self.query_one("#status", StatusBar)

    async def on_mount(self) -> None:
        self.prompt.focus()
        notice = self.conv.backend.notice
        if self.conv.session.messages:
            await self.transcript.replay(shown_items(self.conv.session))
            self.transcript.add_note(f"resumed session {self.conv.session.id}")
        if notice:
            self.transcript.add_note(notice, "warning")
        self.refresh_status()
        self.set_interval(0.5, self.refresh_status)

    # -- status ----------------------------------------------------------------------------------

    def refresh_status(self) -> None:
        m = self.conv.backend.metrics()
        tok_s = m.decode_tokens_per_s
        if (not tok_s) and self.conv.busy and self._turn_chars:
            tok_s = (self._turn_chars / 4) / max(1e-3, time.monotonic() - self._turn_started)
        if self._hint and time.monotonic() - self._last_ctrl_c > QUIT_WINDOW_S:
            self._hint = ""
        self.status_bar.show(
            Status(
                model=self.conv.backend.model_name,
                backend=self.conv.backend.label,
                mode=self.conv.mode,
                tokens_per_s=tok_s,
                context_used=self.conv.context_tokens,
                context_window=self.conv.context_window,
                gpu_used_gb=m.gpu_memory_used_gb,
                gpu_total_gb=m.gpu_memory_total_gb,
                spec=m.speculative or "",
                busy=self.conv.busy,
                hint=self._hint,
            )
        )

    # -- input -----------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def send_prompt(self, event: PromptInput.Submitted) -> None:
        self._close_completions()
        text = event.text
        if slash.parse(text) is not None:
            await self.run_command(text)
            return
        if self.conv.busy:
            self.prompt.text = text
            self.transcript.add_note("a turn is running: wait, or press Esc to interrupt it", "warning")
            return
        self.transcript.add_user(text)
        self._turn_started = time.monotonic()
        self._turn_chars = 0
        self._turn_answered = False
        self.prompt.add_class("-busy")
        self.run_turn(text)
        self.refresh_status()

    @work(exclusive=True, group="turn", exit_on_error=False)
    async def run_turn(self, text: str) -> None:
        """The turn's worker: relays agent events as messages (it never touches widgets)."""
        error = None
        try:
            async for event in self.conv.turn(text):
                self.post_message(AgentEventArrived(event))
        except Exception as e:  # a bug must not take the UI down: report it and keep the session
            error = f"{type(e).__name__}: {e}"
        self.post_message(TurnEnded(error))

    async def run_command(self, text: str) -> None:
        reply = await self.conv.command(text)
        await self.show_reply(reply)

    async def show_reply(self, reply: CommandReply) -> None:
        if reply.quit:
            self.app.exit(reply.text)
            return
        if reply.cleared:
            await self.transcript.clear()
        if reply.resumed:
            await self.transcript.clear()
            await self.transcript.replay(shown_items(self.conv.session))
        if reply.kind == "help":
            self.transcript.add_note(reply.text + "\n\n" + KEYS_HELP, "help")
        elif reply.kind == "sessions" and reply.sessions:
            self.app.push_screen(SessionPicker(reply.sessions, self.conv.session.id), self._resume_picked)
        elif reply.text:
            self.transcript.add_note(reply.text, reply.kind)
        self.refresh_status()

    async def _resume_picked(self, session_id: str | None) -> None:
        if session_id and session_id != self.conv.session.id:
            await self.run_command(f"/resume {session_id}")

    # -- agent events ----------------------------------------------------------------------------

    @on(AgentEventArrived)
    async def show_agent_event(self, message: AgentEventArrived) -> None:
        ev = message.event
        t = self.transcript
        if isinstance(ev, TextDelta):
            self._turn_chars += len(ev.text)
            self._turn_answered = self._turn_answered or bool(ev.text.strip())
            t.append_text(ev.text)
        elif isinstance(ev, ReasoningDelta):
            self._turn_chars += len(ev.text)
            t.append_reasoning(ev.text)
        elif isinstance(ev, ToolCallStarted):
            await t.end_message()
            t.start_tool(ev.call_id, ev.name, ev.arguments)
        elif isinstance(ev, ApprovalRequested):
            self.ask_approval(ev)
        elif isinstance(ev, ToolCallFinished):
            self._close_approval(ev.call_id)
            t.finish_tool(ev)
        elif isinstance(ev, Notice):
            t.add_note(ev.message, "warning" if ev.kind != "info" else "info")
        elif isinstance(ev, AgentError):
            t.add_note(f"error: {ev.message}", "error")
        elif isinstance(ev, TurnFinished):
            await t.end_message()
            for call_id in list(self._approvals):
                self._close_approval(call_id)
            if ev.reason == "interrupted":
                t.add_note("interrupted — the conversation is kept; say how to go on", "warning")
            elif ev.reason == "step_limit":
                t.add_note("stopped at the step limit; ask to continue", "warning")
            elif ev.reason == "done" and not self._turn_answered:
                t.add_note("the model ended its turn without an answer", "warning")
        self.refresh_status()

    def ask_approval(self, ev: ApprovalRequested) -> None:
        card = self.transcript.cards.get(ev.call_id)
        if card is not None:
            card.set_waiting()
        screen = ApprovalScreen(ev.request, type_ahead=self.take_type_ahead)
        self._approvals[ev.call_id] = screen

        def answered(decision: Decision | None) -> None:
            self._approvals.pop(ev.call_id, None)
            decision = decision or Decision.DENY
            if not ev.answered:
                ev.answer(decision)
                if decision is not Decision.DENY and card is not None:
                    card.set_running()
            self.prompt.focus()
            if screen.interrupt_requested and self.conv.busy:
                self.conv.interrupt()

        self.app.push_screen(screen, answered)

    def take_type_ahead(self, text: str) -> None:
        """Keys typed while an approval opened: they belong to the prompt, at its end."""
        prompt = self.prompt
        prompt.move_cursor(prompt.document.end)
        prompt.insert(text)

    def _close_approval(self, call_id: str) -> None:
        """The call was answered elsewhere (interrupt): take its modal down."""
        screen = self._approvals.pop(call_id, None)
        if screen is not None and screen.is_attached:
            screen.dismiss(Decision.DENY)

    @on(TurnEnded)
    def turn_done(self, message: TurnEnded) -> None:
        self.prompt.remove_class("-busy")
        if message.error:
            self.transcript.add_note(f"internal error: {message.error}", "error")
        self.refresh_status()

    # -- completion ------------------------------------------------------------------------------

    @on(TextArea.Changed, "#prompt")
    def update_completions(self) -> None:
        prompt = self.prompt
        row, col = prompt.cursor_location
        before = prompt.document.get_line(row)[:col]
        options: list[Option] = []
        fragment = ""
        if row == 0 and before.startswith("/") and " " not in before:
            fragment = before
            options = [
                Option(f"/{c.name} {c.usage}".strip() + f"  — {c.help}", id=f"/{c.name}")
                for c in slash.complete(before[1:])
            ]
        else:
            at = mention_at_cursor(before)
            if at is not None:
                fragment = "@" + at
                options = [Option(safe_text(f"@{p}"), id=f"@{p}") for p in self.conv.files.complete(at)]
        self._completion_fragment = fragment
        menu = self.completions
        menu.clear_options()
        if options and not (len(options) == 1 and options[0].id == fragment):
            menu.add_options(options)
            menu.highlighted = 0
            menu.add_class("-open")
            prompt.completion_open = True
        else:
            self._close_completions()

    def _close_completions(self) -> None:
        self.completions.remove_class("-open")
        self.prompt.completion_open = False

    @on(PromptInput.CompletionKey)
    def completion_key(self, message: PromptInput.CompletionKey) -> None:
        menu = self.completions
        if message.key == "escape":
            self._close_completions()
        elif message.key == "up":
            menu.action_cursor_up()
        elif message.key == "down":
            menu.action_cursor_down()
        elif message.key in ("tab", "enter"):
            if menu.option_count == 0:  # the menu emptied under the key (typing raced the refresh)
                self._close_completions()
                if message.key == "enter":
                    self.prompt._submit_or_continue()
                return
            index = menu.highlighted if menu.highlighted is not None else 0
            index = min(max(index, 0), menu.option_count - 1)
            chosen = menu.get_option_at_index(index).id or ""
            self._close_completions()
            suffix = "" if chosen.endswith("/") else " "
            self.prompt.replace_fragment(len(self._completion_fragment), chosen + suffix)

    # -- actions ---------------------------------------------------------------------------------

    def action_interrupt(self) -> None:
        if self.prompt.completion_open:
            self._close_completions()
        elif self.conv.busy:
            self.conv.interrupt()

    def action_ctrl_c(self) -> None:
        """Interrupt the turn (or clear the input); a second Ctrl+C within `QUIT_WINDOW_S` quits
        with exit code 130, also while the interrupted turn is still winding down."""
        now = time.monotonic()
        if now - self._last_ctrl_c < QUIT_WINDOW_S:
            self.app.action_quit_interrupted()  # type: ignore[attr-defined]
            return
        self._last_ctrl_c = now
        if self.conv.busy:
            self.conv.interrupt()
        elif self.prompt.text:
            self.prompt.clear()
        self._hint = "press Ctrl+C again to quit"
        self.refresh_status()

    def action_toggle_tool_output(self) -> None:
        """Expand every collapsed tool output, or collapse them all when any is expanded."""
        cards = [c for c in self.transcript.cards.values() if c.collapsible]
        expand = not any(c.expanded for c in cards)
        for card in cards:
            if card.expanded != expand:
                card.toggle()

    def action_quit(self) -> None:
        self.app.exit()

    def action_scroll_transcript(self, direction: int) -> None:
        if direction < 0:
            self.transcript.scroll_page_up()
        else:
            self.transcript.scroll_page_down()
