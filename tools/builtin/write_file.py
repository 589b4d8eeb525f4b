"""write_file: create or overwrite a file with the given content; returns the diff."""

from __future__ import annotations

from typing import Any

from mkcode.tools.builtin.textfile import encode_text, unchanged_since
from mkcode.tools.diffs import unified_diff
from mkcode.tools.result import ToolResult
from mkcode.tools.safe_io import MAX_EDIT_BYTES, atomic_write, read_bytes
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema
from mkcode.tools.text import BINARY_SNIFF_BYTES, looks_binary
from mkcode.tools.workspace import Access, PathError


class WriteFile(Tool):
    name = "write_file"
    kind = ToolKind.EDIT
    description = (
        "Write a file with the given content, creating parent directories as needed and replacing "
        "any existing content. Prefer edit_file for changes to existing files. Returns a unified "
        f"diff against the previous content. At most {MAX_EDIT_BYTES} bytes."
    )
    parameters = object_schema(
        {
            "path": {"type": "string", "description": "File to write."},
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        ["path", "content"],
    )

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        ws = ctx.workspace
        content: str = args["content"]
        try:
            rp = ws.resolve(args["path"], Access.WRITE)
            data = encode_text(content)
            if len(data) > MAX_EDIT_BYTES:
                return ToolResult.failure(
                    f"content is {len(data)} bytes, over the {MAX_EDIT_BYTES}-byte limit"
                )
            old = read_bytes(ws, rp) if rp.exists else None
        except PathError as e:
            return ToolResult.failure(str(e))
        shown = ws.display(rp.path)
        if old is None:
            diff = unified_diff("", content, shown, created=True)
            summary = f"Created {shown} ({len(data)} bytes)"
        elif looks_binary(old[:BINARY_SNIFF_BYTES]):
            diff = f"(replacing a binary file of {len(old)} bytes with {len(data)} bytes of text)\n"
            summary = f"Overwrote {shown}"
        else:
            diff = unified_diff(old.decode("utf-8", "surrogateescape"), content, shown)
            summary = f"Updated {shown}" if diff else f"{shown} unchanged (same content)"

        def commit() -> ToolResult:
            try:
                unchanged_since(ws, rp, old)
                atomic_write(ws, rp, data)
            except PathError as e:
                return ToolResult.failure(str(e))
            return ToolResult.success(
                f"{summary}\n{diff}".rstrip("\n"), path=shown, created=old is None, diff=diff
            )

        return Prepared(preview=diff, run=commit, meta={"path": shown})
