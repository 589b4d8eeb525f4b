"""`mkcode` as the console script runs it, with the backend replaced by a scripted one: the tmux
end-to-end tests start `python -m tests.app.tui.e2e_driver SCENARIO [mkcode args]` so that what
the model does (and when) is fixed, while everything else (argument parsing, the TUI in a real
terminal, sessions on disk, exit codes, `process_exit.leave`) is the real thing.

Scenarios: `slow-load` (the load reports a stage, then never ends), `fail-load` (the model cannot
load), `generate` (the model streams text and never finishes), `read` (a read_file call, then an
answer quoting it), `edit` (an edit_file call, then "Edited."), `shell` (`sleep 30` through
run_shell: a tool still running when the user leaves).
"""

from __future__ import annotations

import asyncio
import sys
import threading

from mkcode.app.core import backend as backends
from mkcode.app.core.process_exit import leave
from tests.app.tui.scripted_engine import scripted_backend, text_step, tool_step

EDIT = {"path": "greet.py", "old_string": '"hello"', "new_string": '"hello, world"'}


def _scenario(name: str):
    if name == "slow-load":

        def load(settings, progress):
            progress("loading weights of slow-model", 0.3)
            threading.Event().wait()  # a load the user gives up on

        return load
    if name == "fail-load":

        def fail(settings, progress):
            raise backends.BackendError("/models/none is not a checkpoint directory (no config.json)")

        return fail
    steps = {
        "generate": [[*text_step("Thinking about it " * 3, pause=0.05), asyncio.Event()]],
        "read": [tool_step("read_file", {"path": "notes.txt"}), text_step("The note says: buy milk.")],
        "edit": [tool_step("edit_file", EDIT, text="I'll change the greeting."), text_step("Edited.")],
        "shell": [tool_step("run_shell", {"command": "sleep 30"}), text_step("Ran it.")],
    }[name]
    return lambda settings, progress: scripted_backend(steps)


def main() -> int:
    scenario, argv = sys.argv[1], sys.argv[2:]
    backends.open_backend = _scenario(scenario)
    from mkcode.app.cli import main as cli_main

    return leave(cli_main(argv))


if __name__ == "__main__":
    sys.exit(main())
