"""`mkcode --plain`: a line-oriented REPL over the same `Conversation` as the TUI.

Input is prompt-toolkit (history shared with the TUI, completion of slash commands and `@file`s,
Esc+Enter or a trailing backslash for a new line); output is rich, streamed inline so it stays in
the terminal's scrollback. Approvals are inline questions with the diff or command printed first.
Ctrl+C during a turn interrupts it; Ctrl+D on an empty prompt quits. Everything printed that did not
come from mkcode itself (model text, tool output, diffs, titles, errors) goes through
`terminal_safe` (via `safe_text` / `safe_syntax` / `TerminalStream`): control characters are shown
escaped, never sent to the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import History
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from rich.console import Console
from rich.text import Text

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
from mkcode.app.core.backend import Backend, BackendError, open_backend
from mkcode.app.core.conversation import CommandReply, Conversation
from mkcode.app.core.history import ShownAssistant, ShownTool, ShownUser, shown_items
from mkcode.app.core.mentions import FileIndex, mention_at_cursor
from mkcode.app.core.prompt_history import PromptHistory
from mkcode.app.core.sessions import SessionStore
from mkcode.app.core.toolview import (
    is_shell,
    marked_text,
    output_excerpt,
    output_head,
    safe_syntax,
    safe_text,
    tool_title,
)
from mkcode.app.settings import Settings, data_dir
from mkcode.tools import Decision
from mkcode.tools.text import TerminalStream, terminal_safe

PLAIN_OUTPUT_LINES = 8  # the first lines of a non-shell tool's output
APPROVAL_ANSWERS = {
    "y": Decision.ALLOW_ONCE,
    "yes": Decision.ALLOW_ONCE,
    "a": Decision.ALLOW_ALWAYS,
    "always": Decision.ALLOW_ALWAYS,
    "n": Decision.DENY,
    "no": Decision.DENY,
}


class SharedHistory(History):
    """prompt-toolkit history backed by the TUI's prompt history file."""

    def __init__(self, store: PromptHistory) -> None:
        super().__init__()
        self.store = store

    def load_history_strings(self) -> Iterable[str]:
        return reversed(self.store.entries)

    def store_string(self, string: str) -> None:
        self.store.append(string)


class MkcodeCompleter(Completer):
    """`/command` at the start of the input, `@path` anywhere."""

    def __init__(self, files: FileIndex) -> None:
        self.files = files

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterable[Completion]:
        before = document.text_before_cursor
        if before.startswith("/") and " " not in before:
            for c in slash.complete(before[1:]):
                yield Completion(f"/{c.name}", start_position=-len(before), display_meta=c.help)
            return
        at = mention_at_cursor(before)
        if at is not None:
            for path in self.files.complete(at):  # shown escaped (prompt-toolkit misses bidi)
                yield Completion(f"@{path}", start_position=-len(at) - 1, display=terminal_safe(f"@{path}"))


def key_bindings() -> KeyBindings:
    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    @kb.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buf = event.current_buffer
        if buf.document.text_before_cursor.endswith("\\"):
            buf.delete_before_cursor(1)
            buf.insert_text("\n")
        else:
            buf.validate_and_handle()

    return kb


class PlainRepl:
    def __init__(self, conv: Conversation, prompt: PromptSession[str], console: Console) -> None:
        self.conv = conv
        self.prompt = prompt
        self.console = console
        self._in_text = False  # the cursor is at the end of streamed answer text
        self._streams: dict[str, tuple[TerminalStream, str]] = {}  # "text" / "reasoning", its style

    async def run(self) -> int:
        backend = self.conv.backend
        header = Text("mkcode", style="bold")
        header.append_text(
            safe_text(f" · {backend.model_name} ({backend.label}) · mode {self.conv.mode} · {self.conv.cwd}")
        )
        self.console.print(header)
        if backend.notice:
            self.console.print(safe_text(backend.notice, style="yellow"))
        if self.conv.session.messages:
            self.replay()
        self.console.print("[dim]/help for commands · Esc+Enter for a new line · Ctrl+D quits[/]")
        while True:
            try:
                text = await self.prompt.prompt_async("› ")
            except KeyboardInterrupt:
                continue
            except EOFError:
                break
            text = text.strip()
            if not text:
                continue
            if slash.parse(text) is not None:
                reply = await self.conv.command(text)
                self.show_reply(reply)
                if reply.quit:
                    return 0
                continue
            await self.turn(text)
        self.conv.save()
        self.console.print(f"[dim]session {self.conv.session.id} saved[/]")
        return 0

    # -- a turn ----------------------------------------------------------------------------------

    async def turn(self, text: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, self.conv.interrupt)
            handler = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
            handler = False
        try:
            async for ev in self.conv.turn(text):
                await self.show_event(ev)
        finally:
            if handler:
                loop.remove_signal_handler(signal.SIGINT)
            self._end_text()

    def _stream(self, kind: str, delta: str, style: str = "") -> None:
        """Print a streamed delta made safe; switching between answer and reasoning ends the other."""
        for other in [k for k in self._streams if k != kind]:
            self._flush_stream(other)
        stream, _ = self._streams.setdefault(kind, (TerminalStream(), style))
        self.console.print(marked_text(stream.feed_marked(delta), style=style), end="")
        self._in_text = True

    def _flush_stream(self, kind: str) -> None:
        stream, style = self._streams.pop(kind)
        self.console.print(marked_text(stream.flush_marked(), style=style), end="")

    def _end_text(self) -> None:
        for kind in list(self._streams):
            self._flush_stream(kind)
        if self._in_text:
            self.console.print()
            self._in_text = False

    async def show_event(self, ev) -> None:
        c = self.console
        if isinstance(ev, TextDelta):
            self._stream("text", ev.text)
        elif isinstance(ev, ReasoningDelta):
            self._stream("reasoning", ev.text, style="dim italic")
        elif isinstance(ev, ToolCallStarted):
            self._end_text()
            c.print(Text(f"● {tool_title(ev.name, ev.arguments)}", style="cyan"))
        elif isinstance(ev, ApprovalRequested):
            await self.ask(ev)
        elif isinstance(ev, ToolCallFinished):
            self.show_tool_result(ev.name, ev.ok, ev.denied, ev.output, ev.diff)
        elif isinstance(ev, Notice):
            self._end_text()
            c.print(safe_text(f"note: {ev.message}", style="yellow"))
        elif isinstance(ev, AgentError):
            self._end_text()
            c.print(safe_text(f"error: {ev.message}", style="bold red"))
        elif isinstance(ev, TurnFinished):
            self._end_text()
            if ev.reason == "interrupted":
                c.print(Text("interrupted — the conversation is kept", style="yellow"))
            pct = 100 * ev.context_tokens / ev.context_window if ev.context_window else 0
            c.print(Text(f"[{ev.usage.completion_tokens} tokens · ctx {pct:.0f}%]", style="dim"))

    def show_tool_result(self, name: str, ok: bool, denied: bool, output: str, diff: str | None) -> None:
        c = self.console
        if denied:
            c.print(safe_text(f"  ⊘ denied: {output.split(chr(10))[0]}", style="yellow"))
        elif diff and ok:
            c.print(safe_syntax(diff.rstrip("\n"), "diff", background_color="default"))
        elif is_shell(name) or not ok:
            excerpt = output_excerpt(output)
            if excerpt:
                c.print(safe_text(excerpt, style="dim" if ok else "red"))
        elif output.strip():  # what a read, a listing or a search returned: its first lines
            c.print(safe_text(output_head(output, PLAIN_OUTPUT_LINES), style="dim"))

    async def ask(self, ev: ApprovalRequested) -> None:
        """Print what the tool wants to do and read y / a / n (the agent waits meanwhile)."""
        self._end_text()
        r = ev.request
        c = self.console
        c.print(safe_text(f"? {tool_title(r.tool, r.args)} — {r.reason}", style="bold yellow"))
        if r.unsandboxed:
            c.print(Text("This runs OUTSIDE the sandbox, with your full permissions.", style="bold red"))
        if r.kind == "edit" and r.preview:
            c.print(safe_syntax(r.preview.rstrip("\n"), "diff", background_color="default"))
        elif r.kind == "shell":
            c.print(safe_syntax(str(r.args.get("command", "")), "bash", background_color="default"))
        can_always = not r.unsandboxed and r.suggested_rule is not None
        always = f" / [a]lways ({r.suggested_rule.describe()})" if can_always and r.suggested_rule else ""
        question = f"Allow? [y]es once{always} / [n]o: "
        answer_session: PromptSession[str] = PromptSession(input=self.prompt.input, output=self.prompt.output)
        if discard_type_ahead(self.prompt.input):
            c.print("[dim](keys typed before this question were discarded: answer it now)[/]")
        while not ev.answered:
            raw = await self._read(answer_session, question)
            decision = APPROVAL_ANSWERS.get(raw)
            if decision is Decision.ALLOW_ALWAYS:
                if not can_always:
                    c.print("[dim]this call cannot be allowed always[/]")
                    continue
                assert r.suggested_rule is not None
                confirm = f"Always allow {r.suggested_rule.describe()} for the rest of this session? [y/N]: "
                if await self._read(answer_session, safe_text(confirm).plain) not in ("y", "yes"):
                    continue
            if decision is None:
                c.print("[dim]answer y, n" + (" or a" if can_always else "") + "[/]")
                continue
            ev.answer(decision)

    @staticmethod
    async def _read(session: PromptSession[str], question: str) -> str:
        try:
            return (await session.prompt_async(question)).strip().lower()
        except (EOFError, KeyboardInterrupt):
            return "n"

    # -- commands and history ----------------------------------------------------------------------

    def show_reply(self, reply: CommandReply) -> None:
        c = self.console
        if reply.kind == "diff":
            c.print(safe_syntax(reply.text.rstrip("\n"), "diff", background_color="default"))
        elif reply.text:
            c.print(safe_text(reply.text, style="red" if reply.kind == "error" else ""))
        if reply.kind == "sessions" and reply.sessions:
            c.print("[dim]resume one with /resume ID[/]")
        if reply.resumed and not reply.undo:
            self.replay()

    def replay(self) -> None:
        c = self.console
        for item in shown_items(self.conv.session):
            if isinstance(item, ShownUser):
                c.print(safe_text(f"› {item.text}", style="bold"))
            elif isinstance(item, ShownAssistant) and item.text:
                c.print(safe_text(item.text))
            elif isinstance(item, ShownTool):
                c.print(Text(f"● {tool_title(item.name, item.arguments)}", style="cyan"))


def make_prompt_session(conv: Conversation, history: PromptHistory, **io) -> PromptSession[str]:
    return PromptSession(
        history=SharedHistory(history),
        completer=MkcodeCompleter(conv.files),
        complete_while_typing=True,
        key_bindings=key_bindings(),
        multiline=False,
        **io,
    )


def discard_type_ahead(pt_input: Any) -> bool:
    """Drop keys typed before an approval question (a line typed ahead must not answer it); True
    when there were some. Only on a terminal: a pipe's input is meant to be read."""
    try:
        fd = pt_input.fileno()
    except (AttributeError, NotImplementedError, ValueError, OSError):
        return False
    if not os.isatty(fd):
        return False
    import select
    import termios

    pending = bool(select.select([fd], [], [], 0)[0])
    with contextlib.suppress(termios.error, OSError):
        termios.tcflush(fd, termios.TCIFLUSH)
    return pending


def run_plain(args: argparse.Namespace, settings: Settings) -> int:
    from mkcode.app.core.sessions import initial_session

    console = Console()
    cwd = Path.cwd()
    store = SessionStore(data_dir())
    try:
        session = initial_session(store, cwd, args.continue_, args.resume, picker=True)
    except KeyError as e:
        console.print(safe_text(f"mkcode: {str(e).strip(chr(34) + chr(39))}", style="red"))
        return 1
    try:
        with console.status("starting the model…") as status:
            backend = open_backend(settings, lambda stage, _f: status.update(stage))
    except BackendError as e:
        console.print(safe_text(f"mkcode: {e}", style="red"))
        return 1
    try:
        conv = Conversation(backend, settings, cwd=cwd, store=store, session=session)
        repl = PlainRepl(
            conv, make_prompt_session(conv, PromptHistory(data_dir() / "prompt_history.jsonl")), console
        )
        if args.resume == "":
            console.print(safe_text(asyncio.run(conv.command("/sessions")).text))
        return asyncio.run(_run_then_close(repl, backend))
    finally:
        backend.close(timeout=0.5)


async def _run_then_close(repl: PlainRepl, backend: Backend) -> int:
    """The REPL, then the engine stopped while this event loop still runs (an engine callback
    reaching a closed loop was the `Event loop is closed` error)."""
    try:
        return await repl.run()
    finally:
        await asyncio.to_thread(backend.close, 0.5)
        sys.stdout.flush()
