"""`python -m mkcode.backend.parallel.torchrun ARGS`: torchrun (`torch.distributed.run`) that dies with
its launcher. `mkcode serve --tensor-parallel N` starts it in a session of its own (so a terminal's
Ctrl+C reaches only `mkcode serve`, which then stops the ranks in order); the parent-death signal
makes torchrun shut its workers down should `mkcode serve` itself be killed."""

from __future__ import annotations

import os
import signal
import sys

from mkcode.backend.parallel.launch import set_parent_death_signal

LAUNCHER_PID_ENV = "MKCODE_LAUNCHER_PID"


def main() -> None:
    set_parent_death_signal(signal.SIGTERM)
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher and int(launcher) != os.getppid():  # the launcher died before the line above
        sys.exit(1)
    from torch.distributed.run import main as torchrun_main

    torchrun_main()


if __name__ == "__main__":
    main()
