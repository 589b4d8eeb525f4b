"""How a tool call is summarised on one line, and which part of it is worth showing in full."""

from __future__ import annotations

import json
from typing import Any

MAX_TITLE = 100


def _arg(args: dict[str, Any] | str, key: str) -> str:
    return str(args.get(key, "")) if isinstance(args, dict) else ""


def tool_title(name: str, args: dict[str, Any] | str) -> str:
    """`read_file src/x.py`, `$ pytest -x`, `grep "TODO" in src` ..."""
    if name == "run_shell":
        title = f"$ {_arg(args, 'command')}"
    elif name in ("read_file", "edit_file", "write_file", "list_dir"):
        title = f"{name} {_arg(args, 'path') or '.'}"
        if name == "read_file" and isinstance(args, dict) and args.get("offset"):
            title += f":{args.get('offset')}"
    elif name == "grep":
        where = _arg(args, "path") or "."
        title = f'grep "{_arg(args, "pattern")}" in {where}'
    elif name == "glob":
        title = f"glob {_arg(args, 'pattern')}"
    else:
        shown = json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else str(args)
        title = f"{name} {shown}"
    title = " ".join(title.split())
    return title if len(title) <= MAX_TITLE else title[: MAX_TITLE - 1] + "…"


def is_shell(name: str) -> bool:
    return name == "run_shell"


def output_excerpt(output: str, max_lines: int = 12) -> str:
    """The last lines of a tool's output (a card shows the tail, where errors usually are)."""
    lines = output.rstrip("\n").splitlines()
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return f"… {len(lines) - max_lines} more lines\n" + "\n".join(lines[-max_lines:])
