"""edit_file: replace an exact, unique string in a file; returns the diff."""

from __future__ import annotations

from typing import Any

from mkcode.tools.builtin.textfile import encode_text, load_text, unchanged_since
from mkcode.tools.diffs import unified_diff
from mkcode.tools.result import ToolResult
from mkcode.tools.safe_io import atomic_write
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema
from mkcode.tools.workspace import Access, PathError


class EditFile(Tool):
    name = "edit_file"
    kind = ToolKind.EDIT
    description = (
        "Edit a file by exact string replacement. old_string must appear in the file exactly as "
        "given (whitespace and indentation included) and exactly once, unless replace_all is true "
        "(then every occurrence is replaced). Include enough surrounding lines to make it unique. "
        "Read the file first. Returns a unified diff of the change. To create a file use write_file."
    )
    parameters = object_schema(
        {
            "path": {"type": "string", "description": "File to edit."},
            "old_string": {"type": "string", "description": "Exact text to replace."},
            "new_string": {"type": "string", "description": "Replacement text."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
        },
        ["path", "old_string", "new_string"],
    )

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        ws = ctx.workspace
        old: str = args["old_string"]
        new: str = args["new_string"]
        replace_all = bool(args.get("replace_all", False))
        try:
            rp = ws.resolve(args["path"], Access.WRITE)
            if not rp.exists:
                return ToolResult.failure(f"{args['path']} does not exist; use write_file to create it")
            data, text = load_text(ws, rp)
        except PathError as e:
            return ToolResult.failure(str(e))
        if old == "":
            return ToolResult.failure("old_string is empty; give the exact text to replace")
        if old == new:
            return ToolResult.failure("old_string and new_string are identical; nothing to change")
        count = text.count(old)
        if count == 0 and "\r\n" in text and "\n" in old:
            # The model usually writes LF; match a CRLF file by converting the strings too.
            old, new = _to_crlf(old), _to_crlf(new)
            count = text.count(old)
        shown = ws.display(rp.path)
        if count == 0:
            return ToolResult.failure(
                f"old_string not found in {shown}; read the file and copy the text exactly"
            )
        if count > 1 and not replace_all:
            return ToolResult.failure(
                f"old_string occurs {count} times in {shown}; add surrounding context to make it unique, "
                "or set replace_all to true"
            )
        new_text = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        diff = unified_diff(text, new_text, shown)

        def commit() -> ToolResult:
            try:
                unchanged_since(ws, rp, data)
                atomic_write(ws, rp, encode_text(new_text))
            except PathError as e:
                return ToolResult.failure(str(e))
            return ToolResult.success(diff, path=shown, replacements=count if replace_all else 1, diff=diff)

        return Prepared(preview=diff, run=commit, meta={"path": shown})


def _to_crlf(s: str) -> str:
    return s.replace("\r\n", "\n").replace("\n", "\r\n")
