"""read_file: numbered lines of a text file, paged with offset/limit."""

from __future__ import annotations

import os
from typing import Any

from mkcode.tools.result import ToolResult
from mkcode.tools.safe_io import open_regular_file
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema
from mkcode.tools.text import BINARY_SNIFF_BYTES, looks_binary
from mkcode.tools.workspace import Access, PathError

DEFAULT_LIMIT = 2000  # lines per call
MAX_LINE_CHARS = 2000  # longer lines are cut
MAX_OUTPUT_CHARS = 256_000  # whole answer


class ReadFile(Tool):
    name = "read_file"
    kind = ToolKind.READ
    description = (
        "Read a text file from the workspace. Returns lines prefixed with their 1-based line "
        f"numbers. By default returns up to {DEFAULT_LIMIT} lines from the start; use offset "
        "(first line, 1-based) and limit (number of lines) to page through long files. Lines over "
        f"{MAX_LINE_CHARS} characters are cut. Binary files are refused. Paths are relative to "
        "the workspace root (or absolute inside it)."
    )
    parameters = object_schema(
        {
            "path": {"type": "string", "description": "File to read."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return."},
        },
        ["path"],
    )

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        return Prepared(preview=f"read {args['path']}", run=lambda: self._run(ctx, args))

    def _run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
        ws = ctx.workspace
        offset = int(args.get("offset", 1))
        limit = int(args.get("limit", DEFAULT_LIMIT))
        try:
            rp = ws.resolve(args["path"], Access.READ)
            with open_regular_file(ws, rp) as (fd, st), os.fdopen(os.dup(fd), "rb") as f:
                return self._format(ws.display(rp.path), f, st.st_size, offset, limit)
        except PathError as e:
            return ToolResult.failure(str(e))

    @staticmethod
    def _format(shown: str, f: Any, size: int, offset: int, limit: int) -> ToolResult:
        sample = f.read(BINARY_SNIFF_BYTES)
        if looks_binary(sample):
            return ToolResult.failure(f"{shown} looks like a binary file ({size} bytes); not shown")
        if size == 0 and not sample:
            return ToolResult.success(f"({shown} is empty)", path=shown, lines=0)
        f.seek(0)
        out: list[str] = []
        chars = 0
        lineno = 0
        replaced = cut_lines = False
        more = False
        while True:
            raw = f.readline(MAX_LINE_CHARS * 4 + 1)
            if not raw:
                break
            if not raw.endswith(b"\n"):
                # An over-long line: skip the rest of it without loading it all.
                rest = b""
                while True:
                    chunk = f.readline(1 << 16)
                    if not chunk or chunk.endswith(b"\n"):
                        rest = chunk
                        break
                if rest or len(raw) > MAX_LINE_CHARS:
                    cut_lines = True
            lineno += 1
            if lineno < offset:
                continue
            if lineno >= offset + limit:
                more = True
                break
            text = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            replaced = replaced or "\ufffd" in text
            if len(text) > MAX_LINE_CHARS:
                text = text[:MAX_LINE_CHARS] + " [... line cut]"
                cut_lines = True
            line = f"{lineno:6d}\t{text}"
            if chars + len(line) > MAX_OUTPUT_CHARS:
                more = True
                break
            out.append(line)
            chars += len(line) + 1
        if lineno < offset and not out:
            return ToolResult.failure(f"offset {offset} is past the end of {shown} ({lineno} lines)")
        notes: list[str] = []
        last = offset + len(out) - 1
        if more:
            notes.append(f"[showing lines {offset}-{last}; more follow: use offset={last + 1}]")
        if cut_lines:
            notes.append(f"[some lines were longer than {MAX_LINE_CHARS} characters and were cut]")
        if replaced:
            notes.append("[the file is not valid UTF-8; undecodable bytes are shown as U+FFFD]")
        body = "\n".join(out + notes)
        return ToolResult.success(body, path=shown, first_line=offset, last_line=last, more=more)
