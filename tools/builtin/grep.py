"""grep: regex search over files, with ripgrep when available and a Python fallback.

ripgrep respects .gitignore; the fallback does not (it skips only .git). Both skip binary files
and do not follow symlinks below the search path.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time
from typing import Any

from mkcode.tools.builtin.glob_files import walk_files
from mkcode.tools.globbing import compile_glob
from mkcode.tools.result import ToolResult
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema
from mkcode.tools.text import BINARY_SNIFF_BYTES, looks_binary
from mkcode.tools.workspace import Access, PathError, Workspace

MAX_MATCHES = 500
MAX_LINE_CHARS = 300
MAX_FILE_BYTES = 20 * 1024 * 1024  # the fallback skips bigger files
TIMEOUT_S = 30.0


class Grep(Tool):
    name = "grep"
    kind = ToolKind.READ
    description = (
        "Search file contents with a regular expression (Rust/Python regex syntax; prefix (?i) for "
        "case-insensitive). path: a file or directory to search (default: the workspace root). "
        "glob: only search files matching it, e.g. '*.py' (matched against file names) or "
        "'src/**/*.ts' (matched against paths). Returns 'path:line:text' lines, at most "
        f"{MAX_MATCHES}. Binary files are skipped."
    )
    parameters = object_schema(
        {
            "pattern": {"type": "string", "description": "Regular expression to search for."},
            "path": {"type": "string", "description": "File or directory to search (default '.')."},
            "glob": {"type": "string", "description": "Only files matching this glob, e.g. '*.py'."},
        },
        ["pattern"],
    )

    def __init__(self, rg_path: str | None = None, use_ripgrep: bool = True) -> None:
        self._rg_explicit = rg_path
        self._use_rg = use_ripgrep

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        return Prepared(
            preview=f"grep {args['pattern']!r} in {args.get('path', '.')}", run=lambda: self._run(ctx, args)
        )

    def ripgrep(self, ws: Workspace) -> str | None:
        """An rg binary outside the writable workspace (one inside could have been replaced)."""
        if not self._use_rg:
            return None
        cand = self._rg_explicit or shutil.which("rg")
        if cand is None:
            return None
        real = os.path.realpath(cand)
        return None if ws.contains(real) else real

    def _run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
        ws = ctx.workspace
        pattern: str = args["pattern"]
        glob: str | None = args.get("glob")
        try:
            regex = re.compile(pattern)
        except re.error as e:
            return ToolResult.failure(f"invalid regular expression {pattern!r}: {e}")
        try:
            rp = ws.resolve(args.get("path", "."), Access.SEARCH)
        except PathError as e:
            return ToolResult.failure(str(e))
        rg = self.ripgrep(ws)
        if rg is not None:
            lines, total, engine = self._ripgrep(rg, ws, rp.path, pattern, glob), None, "ripgrep"
            if lines is None:  # rg rejected the pattern or failed: fall back
                lines, total, engine = *self._python(ws, rp.path, regex, glob), "python"
        else:
            lines, total, engine = *self._python(ws, rp.path, regex, glob), "python"
        if not lines:
            return ToolResult.success(f"no matches for {pattern!r}", matches=0, engine=engine)
        count = len(lines)
        if count > MAX_MATCHES or (total is not None and total > MAX_MATCHES):
            lines = [
                *lines[:MAX_MATCHES],
                f"[... more matches not shown (limit {MAX_MATCHES}); narrow the search]",
            ]
        return ToolResult.success("\n".join(lines), matches=min(count, MAX_MATCHES), engine=engine)

    @staticmethod
    def _ripgrep(rg: str, ws: Workspace, target: str, pattern: str, glob: str | None) -> list[str] | None:
        argv = [rg, "--no-config", "--line-number", "--no-heading", "--with-filename", "--color=never"]
        argv += [f"--max-columns={MAX_LINE_CHARS}", "--max-columns-preview", "--hidden", "--glob=!.git"]
        argv += [f"--max-filesize={MAX_FILE_BYTES}"]
        if glob:
            argv.append(f"--glob={glob}")
        rel = os.path.relpath(target, ws.root) if ws.root_of(target) == ws.root else target
        argv += ["--regexp", pattern, "--", rel]
        proc = subprocess.Popen(
            argv, cwd=ws.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + TIMEOUT_S
        for raw in proc.stdout:
            lines.append(raw.rstrip(b"\n").decode("utf-8", "backslashreplace"))
            if len(lines) > MAX_MATCHES or time.monotonic() > deadline:
                break
        proc.kill()
        _, err = proc.communicate()
        if proc.returncode == 2 and not lines and err:
            return None
        return [_cut(line.removeprefix("./")) for line in lines]

    @staticmethod
    def _python(
        ws: Workspace, target: str, regex: re.Pattern[str], glob: str | None
    ) -> tuple[list[str], int]:
        if os.path.isfile(target):
            files = [target]
        else:
            files = (os.path.join(target, rel) for rel in walk_files(target))
        g = compile_glob(glob) if glob else None

        def wanted(p: str) -> bool:
            # Like rg --glob: a pattern without '/' matches the file name anywhere.
            if g is None or p == target:
                return True
            subject = os.path.basename(p) if "/" not in (glob or "") else os.path.relpath(p, target)
            return g.fullmatch(subject) is not None

        lines: list[str] = []
        deadline = time.monotonic() + TIMEOUT_S
        for path in files:
            if not wanted(path):
                continue
            if len(lines) > MAX_MATCHES or time.monotonic() > deadline:
                break
            shown = ws.display(path)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
                    continue
                with open(path, "rb") as f:
                    if looks_binary(f.read(BINARY_SNIFF_BYTES)):
                        continue
                    f.seek(0)
                    for n, raw in enumerate(f, 1):
                        text = raw.rstrip(b"\r\n").decode("utf-8", "replace")
                        if regex.search(text):
                            lines.append(_cut(f"{shown}:{n}:{text}"))
                            if len(lines) > MAX_MATCHES:
                                break
            except OSError:
                continue
        return lines, len(lines)


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS + 200 else line[: MAX_LINE_CHARS + 200] + " [... line cut]"
