"""Unified diffs for edit previews and results."""

from __future__ import annotations

import difflib

from mkcode.tools.text import truncate_middle

MAX_DIFF_CHARS = 64_000


def unified_diff(old: str, new: str, name: str, *, created: bool = False) -> str:
    """`diff -u` of two texts, labelled a/name and b/name (or /dev/null for a new file)."""
    diff = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile="/dev/null" if created else f"a/{name}",
        tofile=f"b/{name}",
        n=3,
    )
    lines = []
    for line in diff:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        lines.append(line)
    text, _ = truncate_middle("".join(lines), MAX_DIFF_CHARS)
    return text
