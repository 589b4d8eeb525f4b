"""The `mkcode` console entry point.

Parsing is kept light: `mkcode --help` and `mkcode --version` must not import torch, so command
modules import their heavy dependencies inside their handlers.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

from mkcode.app import main_cmd
from mkcode.app.commands import COMMAND_MODULES
from mkcode.app.core.process_exit import leave


def version() -> str:
    try:
        return metadata.version("mkcode")
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return "0.0.0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mkcode",
        description="mkcode: a private terminal coding assistant running North Mini Code on your own GPU.",
    )
    parser.add_argument("--version", action="version", version=f"mkcode {version()}")
    main_cmd.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"mkcode.app.commands.{name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:  # no subcommand: the assistant itself
        try:
            code = main_cmd.run(args)
        except KeyboardInterrupt:
            print("mkcode: interrupted", file=sys.stderr)
            code = 130
        # As the console script (argv from the command line), a load or tool thread still running
        # must not hold the exit; a caller passing argv (tests, embedding) gets the code back.
        return leave(code) if argv is None else code
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
