"""One module per `mkcode` subcommand.

Each module defines `register(subparsers)` which adds its parser (cheap: no torch import at module
level) and sets `func` to a callable taking the parsed args and returning an exit code.
"""

# Order is the order shown in `mkcode --help`.
COMMAND_MODULES = [
    "generate",
    "checkpoint",
    "demo",
    "tool",
    "bench",
    "serve",
    "kernels",
    "doctor",
]
