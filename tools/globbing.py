"""Glob patterns (`*`, `?`, `[...]`, `**`, `{a,b}`) over '/'-separated relative paths, through wcmatch.

Used by the glob tool and by grep's file filter (Python 3.11's fnmatch has no `**`). `*` and `?`
never cross '/', and match names starting with a dot too (ripgrep's --hidden, as grep runs it);
`**` as a whole component matches zero or more components; `{a,b}` expands as in ripgrep's --glob.
"""

from __future__ import annotations

import re
from functools import lru_cache

from wcmatch import glob as wcglob
from wcmatch._wcparse import PatternLimitException

GLOB_CHARS = frozenset("*?[{")
FLAGS = wcglob.GLOBSTAR | wcglob.DOTGLOB | wcglob.BRACE
BRACE_LIMIT = 1000  # expansions of one pattern ('{a,b}{c,d}' is 4)


class GlobError(ValueError):
    """A pattern that cannot be compiled (too many brace expansions)."""


def has_magic(part: str) -> bool:
    return any(c in GLOB_CHARS for c in part)


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Regex matching a whole '/'-separated relative path against `pattern` (use .fullmatch)."""
    try:
        include, _ = wcglob.translate(pattern.strip("/"), flags=FLAGS, limit=BRACE_LIMIT)
    except PatternLimitException as e:
        raise GlobError(f"glob {pattern!r} expands to too many patterns (limit {BRACE_LIMIT})") from e
    return re.compile("|".join(f"(?:{r})" for r in include))


def literal_prefix(pattern: str) -> str:
    """Leading components without glob characters ('src/app' for 'src/app/**/*.py')."""
    parts = pattern.strip("/").split("/")
    prefix: list[str] = []
    for part in parts[:-1]:
        if has_magic(part) or "\\" in part:
            break
        prefix.append(part)
    return "/".join(prefix)
