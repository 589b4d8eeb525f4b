"""Glob patterns (`*`, `?`, `[...]`, `**`) compiled to regular expressions over relative paths.

Used by the glob tool and by grep's file filter; Python 3.11's fnmatch has no `**`.
"""

from __future__ import annotations

import re
from functools import lru_cache

GLOB_CHARS = frozenset("*?[")


def has_magic(part: str) -> bool:
    return any(c in GLOB_CHARS for c in part)


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Regex matching a whole '/'-separated relative path against `pattern`.

    `*` and `?` never cross '/', `**` as a whole component matches zero or more components.
    """
    parts = pattern.strip("/").split("/")
    out: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]*/)*")
            continue
        out.append(_translate_part(part) + ("" if last else "/"))
    return re.compile("".join(out), re.DOTALL)


def _translate_part(part: str) -> str:
    res: list[str] = []
    i, n = 0, len(part)
    while i < n:
        c = part[i]
        i += 1
        if c == "*":
            while i < n and part[i] == "*":
                i += 1
            res.append("[^/]*")
        elif c == "?":
            res.append("[^/]")
        elif c == "[":
            j = i
            if j < n and part[j] in "!^":
                j += 1
            if j < n and part[j] == "]":
                j += 1
            while j < n and part[j] != "]":
                j += 1
            if j >= n:
                res.append(re.escape("["))
                continue
            body = part[i:j].replace("\\", "\\\\")
            i = j + 1
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            res.append(f"(?!/)[{body}]")
        else:
            res.append(re.escape(c))
    return "".join(res)


def literal_prefix(pattern: str) -> str:
    """Leading components without glob characters ('src/app' for 'src/app/**/*.py')."""
    parts = pattern.strip("/").split("/")
    prefix: list[str] = []
    for part in parts[:-1]:
        if has_magic(part):
            break
        prefix.append(part)
    return "/".join(prefix)
