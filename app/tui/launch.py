"""`mkcode` (no subcommand, no -p, no --plain): start the Textual app in the current directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mkcode.app.settings import Settings, data_dir


def run_tui(args: argparse.Namespace, settings: Settings) -> int:
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
        pick_session=args.resume == "",
        history=PromptHistory(data_dir() / "prompt_history.jsonl"),
    )
    app.run()
    conv = app.conversation
    if conv is not None:
        if conv.backend is not None:
            conv.backend.close()
        if conv.session.messages:
            print(f"session {conv.session.id} saved · resume with: mkcode --resume {conv.session.id}")
    return app.return_code or 0
