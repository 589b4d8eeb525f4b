"""`mkcode -p "task"`: one non-interactive agent turn, for scripts and pipes.

The prompt comes from the argument, stdin, or both (stdin is attached after the argument). Nothing
is asked: edits and shell commands are denied unless `--allow-edits` / `--allow-shell` (or a
`--mode`) allow them. Output:

- `text` (default): the final answer on stdout (rendered Markdown on a terminal, raw text in a
  pipe); tool calls and notices go to stderr, so stdout is only the answer;
- `json`: one JSON object at the end (`result`, `subtype`, `session_id`, `usage`, ...);
- `stream-json`: one JSON object per line: `session_started`, every agent event, then the result.

Text output is made terminal-safe (`terminal_safe`: control and invisible format characters shown
escaped, in a pipe too); JSON output keeps the exact text, with every such character written as a
`\\uXXXX` escape, so neither format can drive the terminal it is printed on.

Exit codes: 0 success, 1 error (backend failure, step limit, bad input), 3 when a tool call was
denied (the answer may be incomplete: allow it with a flag), 130 when interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mkcode.app.agent import (
    AgentError,
    AgentEvent,
    Notice,
    Session,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
)
from mkcode.app.core.backend import Backend, BackendError, open_backend
from mkcode.app.core.conversation import Conversation
from mkcode.app.core.process_exit import hard_exit
from mkcode.app.core.sessions import SessionStore
from mkcode.app.core.toolview import tool_title
from mkcode.app.settings import Settings, data_dir
from mkcode.tools import AllowRule
from mkcode.tools.text import json_terminal_safe, terminal_safe

EXIT_OK, EXIT_ERROR, EXIT_DENIED, EXIT_INTERRUPTED = 0, 1, 3, 130
CLOSE_TIMEOUT_S = 0.5  # the engine thread gets this long to stop at the end
OUTPUT_FORMATS = ("text", "json", "stream-json")


@dataclass
class OneShotOptions:
    prompt: str
    output_format: str = "text"
    allow_edits: bool = False
    allow_shell: bool = False
    session: Session | None = None  # --continue / --resume


@dataclass
class _Tally:
    """What the turn did, for the result object and the exit code."""

    answer_parts: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    denied: int = 0
    errors: list[str] = field(default_factory=list)
    finished: TurnFinished | None = None

    @property
    def answer(self) -> str:
        return "".join(self.answer_parts).strip()


def read_prompt(arg: str | None, stdin: IO[str]) -> str:
    """The argument, stdin (when piped), or both joined; empty when neither gives anything."""
    piped = "" if stdin.isatty() else stdin.read()
    parts = [p.strip() for p in (arg or "", piped) if p and p.strip()]
    return "\n\n".join(parts)


def rules_for(opts: OneShotOptions) -> list[AllowRule]:
    rules = []
    if opts.allow_edits:
        rules += [AllowRule("edit_file"), AllowRule("write_file")]
    if opts.allow_shell:
        rules.append(AllowRule("run_shell"))
    return rules


def exit_code(tally: _Tally) -> int:
    fin = tally.finished
    if fin is None or fin.reason in ("error", "step_limit") or tally.errors:
        return EXIT_ERROR
    if fin.reason == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_DENIED if tally.denied else EXIT_OK


def _subtype(code: int) -> str:
    return {EXIT_OK: "success", EXIT_DENIED: "denied", EXIT_INTERRUPTED: "interrupted"}.get(code, "error")


def result_object(conv: Conversation, tally: _Tally, code: int, duration_s: float) -> dict[str, Any]:
    fin = tally.finished
    return {
        "type": "result",
        "subtype": _subtype(code),
        "is_error": code != EXIT_OK,
        "exit_code": code,
        "result": tally.answer,
        "session_id": conv.session.id,
        "model": conv.backend.model_name,
        "backend": conv.backend.kind,
        "num_steps": fin.steps if fin else 0,
        "usage": fin.usage.to_dict() if fin else None,
        "tool_calls": tally.tools,
        "denied": tally.denied,
        "error": (fin.error if fin and fin.error else None) or ("; ".join(tally.errors) or None),
        "duration_s": round(duration_s, 3),
    }


class _Printer:
    """Writes events as the chosen output format asks."""

    def __init__(self, fmt: str, out: IO[str], err: IO[str]) -> None:
        self.fmt, self.out, self.err = fmt, out, err

    def json_line(self, obj: dict[str, Any]) -> None:
        self.out.write(json_terminal_safe(json.dumps(obj, ensure_ascii=False, default=str)) + "\n")
        self.out.flush()

    def event(self, ev: AgentEvent) -> None:
        if self.fmt == "stream-json":
            self.json_line(ev.to_dict())
            return
        if self.fmt != "text":
            return
        if isinstance(ev, ToolCallStarted):
            self.err.write(f"· {tool_title(ev.name, ev.arguments)}\n")
        elif isinstance(ev, ToolCallFinished) and not ev.ok:
            what = "denied" if ev.denied else "failed"
            first = ev.output.split("\n")[0]
            self.err.write(terminal_safe(f"  {ev.name} {what}: {first}") + "\n")
        elif isinstance(ev, Notice):
            self.err.write(terminal_safe(f"note: {ev.message}") + "\n")
        elif isinstance(ev, AgentError):
            self.err.write(terminal_safe(f"error: {ev.message}") + "\n")
        self.err.flush()

    def answer(self, text: str) -> None:
        if self.fmt != "text" or not text:
            return
        text = terminal_safe(text)
        if self.out.isatty():
            from rich.console import Console
            from rich.markdown import Markdown

            Console(file=self.out).print(Markdown(text))
        else:
            self.out.write(text + "\n")
        self.out.flush()


async def run_turn(conv: Conversation, opts: OneShotOptions, out: IO[str], err: IO[str]) -> int:
    """Run the prompt through `conv` and print; returns the exit code."""
    printer = _Printer(opts.output_format, out, err)
    if opts.output_format == "stream-json":
        printer.json_line(
            {
                "type": "session_started",
                "session_id": conv.session.id,
                "model": conv.backend.model_name,
                "backend": conv.backend.kind,
                "cwd": str(conv.cwd),
                "mode": conv.mode,
            }
        )
    tally = _Tally()
    t0 = time.monotonic()
    async for ev in conv.turn(opts.prompt):
        printer.event(ev)
        if isinstance(ev, TextDelta):
            tally.answer_parts.append(ev.text)
        elif isinstance(ev, ToolCallStarted):
            tally.answer_parts.clear()  # the answer is what the model says after its last tool call
        elif isinstance(ev, ToolCallFinished):
            tally.denied += int(ev.denied)
            tally.tools.append({"name": ev.name, "ok": ev.ok, "denied": ev.denied})
        elif isinstance(ev, AgentError):
            tally.errors.append(ev.message)
        elif isinstance(ev, TurnFinished):
            tally.finished = ev
    code = exit_code(tally)
    result = result_object(conv, tally, code, time.monotonic() - t0)
    if opts.output_format == "text":
        printer.answer(tally.answer)
        if tally.denied:
            err.write(
                f"mkcode: {tally.denied} tool call(s) denied; allow them with --allow-edits / --allow-shell\n"
            )
    else:
        printer.json_line(result)
    return code


def run_oneshot(
    settings: Settings,
    opts: OneShotOptions,
    *,
    cwd: Path | None = None,
    backend: Backend | None = None,
    store: SessionStore | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    if opts.output_format not in OUTPUT_FORMATS:
        err.write(f"mkcode: --output-format must be one of {', '.join(OUTPUT_FORMATS)}\n")
        return EXIT_ERROR
    if not opts.prompt:
        err.write('mkcode: -p needs a prompt: mkcode -p "task", or pipe it on stdin\n')
        return EXIT_ERROR
    owned = backend is None
    if backend is None:
        try:
            backend = open_backend(settings, _stderr_progress(err))
        except BackendError as e:
            _error(opts, out, err, str(e))
            return EXIT_ERROR
    if backend.notice:
        err.write(terminal_safe(backend.notice) + "\n")
    try:
        conv = Conversation(
            backend,
            settings,
            cwd=cwd or Path.cwd(),
            store=store or SessionStore(data_dir()),
            session=opts.session,
            interactive=False,
            rules=rules_for(opts),
        )
        close = (lambda: backend.close(timeout=CLOSE_TIMEOUT_S)) if owned else None
        return asyncio.run(_interruptible_turn(conv, opts, out, err, close))
    except KeyboardInterrupt:
        err.write("mkcode: interrupted\n")
        return EXIT_INTERRUPTED
    finally:
        if owned:
            backend.close(timeout=CLOSE_TIMEOUT_S)


async def _interruptible_turn(
    conv: Conversation, opts: OneShotOptions, out: IO[str], err: IO[str], close: Callable[[], None] | None
) -> int:
    """`run_turn` with Ctrl+C as an interrupt, not an exception: the first one interrupts the turn
    (the model stops, a running command is killed, the session is saved) and the exit code is 130;
    a second one leaves at once. The engine is stopped while this event loop still runs, so no
    engine-thread callback can reach a closed loop (the `Event loop is closed` error)."""
    loop = asyncio.get_running_loop()
    presses = 0

    def on_sigint() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            err.write("\nmkcode: interrupting (Ctrl+C again quits at once)\n")
            err.flush()
            conv.interrupt()
            return
        for stream in (out, err):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        hard_exit(EXIT_INTERRUPTED)

    installed = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        installed = True
    try:
        code = await run_turn(conv, opts, out, err)
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)
        if close is not None:
            await asyncio.to_thread(close)
    if presses:
        err.write("mkcode: interrupted\n")
        return EXIT_INTERRUPTED
    return code


def _error(opts: OneShotOptions, out: IO[str], err: IO[str], message: str) -> None:
    if opts.output_format == "text":
        err.write(terminal_safe(f"mkcode: {message}") + "\n")
    else:
        obj = {"type": "result", "subtype": "error", "is_error": True, "exit_code": EXIT_ERROR}
        out.write(json.dumps({**obj, "result": "", "error": message}) + "\n")


def _stderr_progress(err: IO[str]):
    """Load stages on stderr when it is a terminal (silent in pipes and tests)."""
    if not err.isatty():
        return None

    def say(stage: str, _fraction: float | None) -> None:
        err.write(f"\r\033[2K{stage}…")
        if stage == "ready":
            err.write("\r\033[2K")
        err.flush()

    return say
