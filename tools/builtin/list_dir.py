"""list_dir: the entries of one directory, with kinds and sizes."""

from __future__ import annotations

import os
import stat
from typing import Any

from mkcode.tools.fdwalk import SecretFilter, list_entries, open_dir
from mkcode.tools.result import ToolResult
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema
from mkcode.tools.text import display_path
from mkcode.tools.workspace import Access, PathError

MAX_ENTRIES = 1000


class ListDir(Tool):
    name = "list_dir"
    kind = ToolKind.READ
    description = (
        "List a directory in the workspace (default: the workspace root). Directories end with "
        "'/', symlinks show their target, files show their size in bytes. Not recursive: use glob "
        f"for that. At most {MAX_ENTRIES} entries."
    )
    parameters = object_schema(
        {"path": {"type": "string", "description": "Directory to list (default '.')."}}, []
    )

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        return Prepared(preview=f"list {args.get('path', '.')}", run=lambda: self._run(ctx, args))

    def _run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
        ws = ctx.workspace
        try:
            rp = ws.resolve(args.get("path", "."), Access.LIST)
            shown = ws.display(rp.path)
            hidden = SecretFilter.below(ws, rp.path)
            with open_dir(ws, rp.path) as fd:
                try:
                    names = [n for n, _ in list_entries(fd)]
                except OSError as e:
                    return ToolResult.failure(f"cannot list {shown}: {e.strerror}")
                visible = [n for n in names if not hidden.hides(os.path.join(rp.path, n))]
                lines = [_describe(fd, name) for name in visible[:MAX_ENTRIES]]
        except PathError as e:
            return ToolResult.failure(str(e))
        skipped = len(names) - len(visible)
        if not visible:
            text = f"{shown}/ is empty" if not skipped else f"{shown}/ has no entries that may be shown"
            return ToolResult.success(
                "\n".join([text, *_skipped_note(skipped)]), path=shown, entries=0, protected_skipped=skipped
            )
        if len(visible) > MAX_ENTRIES:
            lines.append(f"[... {len(visible) - MAX_ENTRIES} more entries not shown]")
        lines += _skipped_note(skipped)
        return ToolResult.success(
            "\n".join(lines), path=shown, entries=len(visible), protected_skipped=skipped
        )


def _skipped_note(n: int) -> list[str]:
    return [f"[{n} protected entries (credentials, keys, histories) not shown]"] if n else []


def _describe(dfd: int, name: str) -> str:
    shown = display_path(name)
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return f"{shown} [unreadable]"
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return f"{shown}/"
    if stat.S_ISLNK(mode):
        try:
            target = display_path(os.readlink(name, dir_fd=dfd))
        except OSError:
            target = "?"
        return f"{shown} -> {target}"
    if stat.S_ISREG(mode):
        return f"{shown}  ({st.st_size} bytes)"
    kinds = {
        stat.S_ISFIFO: "fifo",
        stat.S_ISSOCK: "socket",
        stat.S_ISCHR: "char device",
        stat.S_ISBLK: "block device",
    }
    for test, label in kinds.items():
        if test(mode):
            return f"{shown} [{label}]"
    return f"{shown} [special]"
