"""list_dir: the entries of one directory, with kinds and sizes."""

from __future__ import annotations

import os
import stat
from typing import Any

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
            fd = os.open(rp.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except PathError as e:
            return ToolResult.failure(str(e))
        except OSError as e:
            return ToolResult.failure(f"cannot open {args.get('path', '.')}: {e.strerror}")
        try:
            if not ws.contains(os.readlink(f"/proc/self/fd/{fd}")):
                return ToolResult.failure("directory was redirected outside the workspace; refused")
            names = sorted(os.listdir(fd), key=lambda n: os.fsencode(n))
            lines: list[str] = []
            for name in names[:MAX_ENTRIES]:
                lines.append(_describe(fd, name))
        except OSError as e:
            return ToolResult.failure(f"cannot list {ws.display(rp.path)}: {e.strerror}")
        finally:
            os.close(fd)
        shown = ws.display(rp.path)
        if not names:
            return ToolResult.success(f"{shown}/ is empty", path=shown, entries=0)
        if len(names) > MAX_ENTRIES:
            lines.append(f"[... {len(names) - MAX_ENTRIES} more entries not shown]")
        return ToolResult.success("\n".join(lines), path=shown, entries=len(names))


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
