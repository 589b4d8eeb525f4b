"""What `mkcode` does without a subcommand: the TUI, the plain REPL (`--plain`) or one-shot (`-p`).

`add_arguments` puts the top-level flags on the root parser; `run` picks the front end. Only
argparse and the settings module are imported here: Textual, prompt-toolkit and torch are
imported by the front end that needs them, so `mkcode --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mkcode.app.settings import (
    DECODES,
    MODES,
    THEMES,
    SettingsError,
    add_speculative_flags,
    data_dir,
    load_settings,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("assistant (no subcommand: open the terminal UI in this directory)")
    g.add_argument(
        "-p",
        "--print",
        dest="print_prompt",
        nargs="?",
        const="",
        default=None,
        metavar="PROMPT",
        help="run one task non-interactively and print the answer (prompt from here and/or stdin)",
    )
    g.add_argument(
        "--output-format",
        choices=("text", "json", "stream-json"),
        default="text",
        help="with -p: text (default), one JSON result, or JSON lines of agent events",
    )
    g.add_argument("--plain", action="store_true", help="line-mode REPL instead of the full-screen UI")
    g.add_argument(
        "-c", "--continue", dest="continue_", action="store_true", help="continue the latest session here"
    )
    g.add_argument(
        "-r",
        "--resume",
        nargs="?",
        const="",
        default=None,
        metavar="ID",
        help="resume a saved session (pick from a list when no ID)",
    )
    g.add_argument("--model", metavar="DIR", help="checkpoint directory to run in process")
    g.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda when present)")
    g.add_argument("--endpoint", metavar="URL", help="use an OpenAI-compatible server (…/v1) instead")
    g.add_argument("--mode", choices=MODES, help="permission mode (default: ask)")
    g.add_argument("--decode", choices=DECODES, help=argparse.SUPPRESS)
    g.add_argument("--theme", choices=THEMES, help="colour theme (default: dark)")
    add_speculative_flags(g, default=False)
    g.add_argument("--allow-edits", action="store_true", help="with -p: let the agent edit files")
    g.add_argument("--allow-shell", action="store_true", help="with -p: let the agent run shell commands")
    g.add_argument(
        "--allow-broad-workspace",
        action="store_true",
        help="start in your home directory (or a folder above it) without asking; -p refuses it otherwise",
    )
    g.add_argument(
        "--dangerously-no-sandbox",
        action="store_true",
        help="run shell commands on the host, outside bubblewrap (never the default)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args)
        if getattr(args, "decode", None):
            settings.decode = args.decode
    except SettingsError as e:
        print(f"mkcode: {e}", file=sys.stderr)
        return 2
    if Path.cwd().resolve() == Path("/"):  # the file tools refuse / as a workspace root anyway
        print("mkcode: refusing to start in /: the workspace would be the whole filesystem", file=sys.stderr)
        return 2
    broad = _broad_workspace(args)
    if args.print_prompt is not None:
        if broad:
            print(
                f"mkcode: refusing to start here: {broad}. Run it in a project folder, or pass "
                "--allow-broad-workspace",
                file=sys.stderr,
            )
            return 2
        return _oneshot(args, settings)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            'mkcode: the interactive UI needs a terminal; for pipes use mkcode -p "task"',
            file=sys.stderr,
        )
        return 2
    if broad and not confirm_broad_workspace(broad):
        return 1
    if args.plain:
        from mkcode.app.plain.repl import run_plain

        return run_plain(args, settings)
    from mkcode.app.tui.launch import run_tui

    return run_tui(args, settings)


def _broad_workspace(args: argparse.Namespace) -> str | None:
    """Why the current directory is too broad a workspace (None when fine or explicitly allowed)."""
    from mkcode.tools.workspace import broad_workspace_reason

    return None if getattr(args, "allow_broad_workspace", False) else broad_workspace_reason(Path.cwd())


def confirm_broad_workspace(reason: str, ask=None) -> bool:
    """Ask y/N before the TUI or the plain REPL starts with a workspace that exposes too much."""
    print(f"mkcode: {reason}.", file=sys.stderr)
    try:
        answer = (ask or input)("Start here anyway? [y/N] ")
    except (EOFError, KeyboardInterrupt):
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def _oneshot(args: argparse.Namespace, settings) -> int:
    from mkcode.app.core.sessions import SessionStore, initial_session
    from mkcode.app.oneshot import OneShotOptions, read_prompt, run_oneshot

    store = SessionStore(data_dir())
    try:
        session = initial_session(store, Path.cwd(), args.continue_, args.resume, picker=False)
    except KeyError as e:
        print(f"mkcode: {str(e).strip(chr(34) + chr(39))}", file=sys.stderr)
        return 1
    opts = OneShotOptions(
        prompt=read_prompt(args.print_prompt, sys.stdin),
        output_format=args.output_format,
        allow_edits=args.allow_edits,
        allow_shell=args.allow_shell,
        session=session,
    )
    return run_oneshot(settings, opts, store=store)
