"""`mkcode` (no subcommand, no -p, no --plain): start the Textual app in the current directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mkcode.app.settings import Settings, data_dir

CLOSE_TIMEOUT_S = 0.5  # the engine thread gets this long to stop when the UI has closed


def run_tui(args: argparse.Namespace, settings: Settings) -> int:
    """The app's exit code: 0 after /quit or Ctrl+D, 130 after Ctrl+C, 1 when the model could not
    load. The caller (`cli.main`) leaves through `process_exit.leave`, so a load still running in
    its thread does not hold the process."""
    from mkcode.app.core import backend as backends
    from mkcode.app.core.prompt_history import PromptHistory
    from mkcode.app.core.sessions import SessionStore, initial_session
    from mkcode.app.tui.app import MkcodeApp

    cwd = Path.cwd()
    store = SessionStore(data_dir())
    try:
        session = initial_session(store, cwd, args.continue_, args.resume, picker=True)
    except KeyError as e:
        print(f"mkcode: {str(e).strip(chr(34) + chr(39))}", file=sys.stderr)
        return 1
    app = MkcodeApp(
        settings,
        cwd=cwd,
        store=store,
        session=session,
        backend_factory=backends.open_backend,
        pick_session=args.resume == "",
        history=PromptHistory(data_dir() / "prompt_history.jsonl"),
    )
    app.run()
    code = app.return_code or 0
    conv = app.conversation
    if conv is not None:
        conv.backend.close(timeout=CLOSE_TIMEOUT_S)  # stopped already when the app unmounted
        if conv.session.messages:
            print(f"session {conv.session.id} saved · resume with: mkcode --resume {conv.session.id}")
    elif app.load_error:  # the screen that showed it is gone: leave it in the scrollback too
        print(f"mkcode: could not start: {app.load_error}", file=sys.stderr)
        code = code or 1
    elif code == 130:
        print("mkcode: interrupted while loading", file=sys.stderr)
    return code
