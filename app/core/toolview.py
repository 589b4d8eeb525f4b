"""How a tool call is summarised on one line, which part of it is worth showing in full, and how
untrusted text (tool output, diffs, model text) is made safe to show: `safe_text` and `safe_syntax`
run it through `terminal_safe` and mark each escaped control character in a style of its own."""

from __future__ import annotations

import json
from typing import Any

from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text

from mkcode.tools.text import terminal_safe, terminal_safe_marked

MAX_TITLE = 100
ESCAPE_STYLE = Style(bold=True, reverse=True)  # where a control character was: ␛, ␍, <U+202E> ...


def safe_text(text: str, style: str | Style = "") -> Text:
    """Untrusted text as a rich `Text`: controls escaped (and marked), no markup parsed."""
    return marked_text(terminal_safe_marked(text), style)


def marked_text(marked: tuple[str, list[tuple[int, int]]], style: str | Style = "") -> Text:
    """Text already made safe (`terminal_safe_marked`, `TerminalStream.feed_marked`) with its
    markers styled."""
    safe, spans = marked
    out = Text(safe, style=style)
    for start, end in spans:
        out.stylize(ESCAPE_STYLE, start, end)
    return out


def safe_syntax(code: str, lexer: str, **kwargs: Any) -> Syntax:
    """Untrusted code or a diff, highlighted, with controls escaped and marked."""
    safe, spans = terminal_safe_marked(code)
    syntax = Syntax(safe, lexer, **kwargs)
    if spans:
        line_starts = [0] + [i + 1 for i, ch in enumerate(safe) if ch == "\n"]
        line = 0
        for start, end in spans:  # a marker never spans a newline
            while line + 1 < len(line_starts) and line_starts[line + 1] <= start:
                line += 1
            col = start - line_starts[line]
            syntax.stylize_range(ESCAPE_STYLE, (line + 1, col), (line + 1, col + end - start))
    return syntax


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
    title = " ".join(terminal_safe(title).split())
    return title if len(title) <= MAX_TITLE else title[: MAX_TITLE - 1] + "…"


def is_shell(name: str) -> bool:
    return name == "run_shell"


def output_excerpt(output: str, max_lines: int = 12) -> str:
    """The last lines of a tool's output (a card shows the tail, where errors usually are). Lines
    end at LF only: a lone CR, FS/GS/RS, NEL or U+2028 is shown escaped, not taken as a line end."""
    lines = output.rstrip("\n").split("\n")
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return f"… {len(lines) - max_lines} more lines\n" + "\n".join(lines[-max_lines:])


def output_head(output: str, max_lines: int = 12) -> str:
    """The first lines of a tool's output (a listing or a file reads from the top). Lines end at
    LF only, as in `output_excerpt`."""
    lines = output.rstrip("\n").split("\n")
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return "\n".join(lines[:max_lines]) + f"\n… {len(lines) - max_lines} more lines"
