"""glob: files in the workspace whose relative path matches a glob pattern."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from mkcode.tools.fdwalk import WalkStats, walk
from mkcode.tools.globbing import GlobError, compile_glob, literal_prefix
from mkcode.tools.result import ToolResult
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema
from mkcode.tools.text import display_path
from mkcode.tools.workspace import Access, PathError, Workspace

MAX_RESULTS = 1000
SKIP_DIRS = frozenset({".git"})


def walk_files(ws: Workspace, start: str, stats: WalkStats | None = None) -> Iterator[str]:
    """Files (and symlinks, not followed) under the checked directory `start`, relative to it.

    The walk goes through directory descriptors (fdwalk.walk): .git and secret entries are skipped.
    """
    for entry in walk(ws, start, skip_dirs=SKIP_DIRS, stats=stats):
        yield entry.rel


class Glob(Tool):
    name = "glob"
    kind = ToolKind.READ
    description = (
        "Find files by glob pattern, relative to the workspace root: '*' and '?' match within one "
        "path component, '**' matches any number of directories, '[abc]' a character set. "
        "Examples: '**/*.py', 'src/**/test_*.py', '*.md'. Returns matching paths sorted by name "
        f"(at most {MAX_RESULTS}); .git is skipped and symlinks are not followed."
    )
    parameters = object_schema(
        {"pattern": {"type": "string", "description": "Glob pattern, e.g. '**/*.py'."}}, ["pattern"]
    )

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        return Prepared(preview=f"glob {args['pattern']}", run=lambda: self._run(ctx, args["pattern"]))

    def _run(self, ctx: ToolContext, pattern: str) -> ToolResult:
        ws = ctx.workspace
        if not pattern or "\x00" in pattern:
            return ToolResult.failure("pattern must be a non-empty string")
        if pattern.startswith("/") or ".." in pattern.split("/"):
            return ToolResult.failure(
                "pattern must be relative to the workspace root and must not contain '..'"
            )
        prefix = literal_prefix(pattern)
        try:
            start = ws.resolve(prefix or ".", Access.LIST).path
        except PathError as e:
            if "does not exist" in str(e):
                return ToolResult.success(f"no files match {pattern}", matches=0)
            return ToolResult.failure(str(e))
        # Match the rest of the pattern below the (resolved) literal prefix directory.
        rest = pattern.strip("/")[len(prefix) :].lstrip("/")
        try:
            regex = compile_glob(rest)
        except GlobError as e:
            return ToolResult.failure(str(e))
        matches: list[str] = []
        total = 0
        stats = WalkStats()
        try:
            for rel in walk_files(ws, start, stats):
                if regex.fullmatch(rel):
                    total += 1
                    if len(matches) < MAX_RESULTS:
                        matches.append(display_path(os.path.join(prefix, rel) if prefix else rel))
        except PathError as e:
            return ToolResult.failure(str(e))
        notes = stats.notes()
        meta = {"protected_skipped": stats.secret_skipped}
        if not matches:
            return ToolResult.success("\n".join([f"no files match {pattern}", *notes]), matches=0, **meta)
        if total > len(matches):
            matches.append(f"[... {total - len(matches)} more matches not shown; narrow the pattern]")
        return ToolResult.success("\n".join(matches + notes), matches=total, **meta)
