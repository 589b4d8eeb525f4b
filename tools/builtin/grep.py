"""grep: regex search over files, with ripgrep in the sandbox when available, else a Python walk.

ripgrep respects .gitignore; it runs inside the bubblewrap sandbox (like a shell command: it sees
only what a sandboxed command sees, so a symlink swapped in during its walk cannot lead it to the
host's files) with --no-follow (its default) and the protected entries below the search path
excluded. Without the sandbox, the Python walk goes through directory descriptors (fdwalk): no
symlink is followed, secret entries are skipped and counted. Both skip binary files, .git and
what the repository's .gitignore files exclude (tools/gitignore.py for the Python walk).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
import shlex
import shutil
import time
from typing import Any

from mkcode.tools import fdwalk
from mkcode.tools.builtin.glob_files import SKIP_DIRS
from mkcode.tools.gitignore import GitIgnore
from mkcode.tools.globbing import GlobError, compile_glob
from mkcode.tools.result import ToolResult
from mkcode.tools.sandbox.runner import run_shell_command, sandbox_status
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema
from mkcode.tools.text import BINARY_SNIFF_BYTES, looks_binary
from mkcode.tools.workspace import Access, PathError, ResolvedPath, Workspace

MAX_MATCHES = 500
MAX_LINE_CHARS = 300
MAX_FILE_BYTES = 20 * 1024 * 1024  # the fallback skips bigger files
TIMEOUT_S = 30.0
RG_OUTPUT_CAP = 1 << 20  # bytes of rg output read back from the sandbox


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
        lines: list[str] | None = None
        skipped = 0
        engine = "python"
        rg = self.ripgrep(ws) if not (rp.lstat is not None and os.path.isfile(rp.path)) else None
        if rg is not None and sandbox_status(ctx.sandbox, ws.roots).available:
            found = self._ripgrep(rg, ctx, rp, pattern, glob)
            if found is not None:  # None: rg rejected the pattern or failed; the walk answers
                lines, skipped = found
                engine = "ripgrep"
        if lines is None:
            try:
                lines, skipped = self._python(ws, rp, regex, glob)
            except PathError as e:
                return ToolResult.failure(str(e))
        note = [f"[{skipped} protected entries (credentials, keys, histories) skipped]"] if skipped else []
        meta = {"engine": engine, "protected_skipped": skipped}
        if not lines:
            return ToolResult.success("\n".join([f"no matches for {pattern!r}", *note]), matches=0, **meta)
        count = len(lines)
        if count > MAX_MATCHES:
            lines = [
                *lines[:MAX_MATCHES],
                f"[... more matches not shown (limit {MAX_MATCHES}); narrow the search]",
            ]
        return ToolResult.success("\n".join(lines + note), matches=min(count, MAX_MATCHES), **meta)

    @staticmethod
    def _ripgrep(
        rg: str, ctx: ToolContext, rp: ResolvedPath, pattern: str, glob: str | None
    ) -> tuple[list[str], int] | None:
        """rg inside the sandbox, from the root holding the target, secrets excluded by anchored globs.

        Its output is capped and base64-encoded inside the sandbox, so file names that are not UTF-8
        survive the trip and show as \\xNN like everywhere else. None when rg failed.
        """
        ws = ctx.workspace
        argv = [rg, "--no-config", "--line-number", "--no-heading", "--with-filename", "--color=never"]
        argv += [f"--max-columns={MAX_LINE_CHARS}", "--max-columns-preview", "--hidden", "--glob=!.git"]
        argv += [f"--max-filesize={MAX_FILE_BYTES}", f"--max-count={MAX_MATCHES + 1}"]
        if glob:
            argv.append(f"--glob={glob}")
        hidden = fdwalk.SecretFilter.below(ws, rp.path)
        # Anchored globs ('!/x') match relative to rg's working directory, the target's root. They
        # come after the model's glob: rg lets a later glob win, and '{.ssh,x}' would re-include.
        argv += [f"--glob=!/{os.path.relpath(p, rp.root)}" for p in sorted(hidden.entries)]
        argv += ["--regexp", pattern, "--", os.path.relpath(rp.path, rp.root)]
        rg_cmd = " ".join(shlex.quote(a) for a in argv)
        command = f"set -o pipefail; {rg_cmd} 2>/dev/null | head -c {RG_OUTPUT_CAP} | base64 -w0"
        limits = dataclasses.replace(ctx.sandbox.limits, output_chars=RG_OUTPUT_CAP * 2)
        try:
            outcome = run_shell_command(
                command,
                roots=ws.roots,
                cwd=rp.root,
                timeout_s=TIMEOUT_S,
                settings=dataclasses.replace(ctx.sandbox, limits=limits),
                sandboxed=True,
                cancel=ctx.cancel,
            ).process
        except (OSError, RuntimeError):
            return None
        # 0: matches, 1: none, 141: head closed the pipe (more output than the cap); else an error.
        if outcome.exit_code not in (0, 1, 141) or outcome.truncated:
            return None
        try:
            raw = base64.b64decode(outcome.output.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        found = raw.split(b"\n")
        if outcome.exit_code == 141 or not raw.endswith(b"\n"):
            found = found[:-1]  # a line cut by the cap
        prefix = "" if rp.root == ws.root else rp.root.rstrip("/") + "/"
        lines = [
            _cut(prefix + line.decode("utf-8", "backslashreplace").removeprefix("./"))
            for line in found[: MAX_MATCHES + 1]
            if line
        ]
        return lines, sum(1 for p in hidden.entries if os.path.lexists(p))

    @staticmethod
    def _python(
        ws: Workspace, rp: ResolvedPath, regex: re.Pattern[str], glob: str | None
    ) -> tuple[list[str], int]:
        """Search through directory descriptors; (lines, protected entries skipped)."""
        try:
            g = compile_glob(glob) if glob else None
        except GlobError as e:
            raise PathError(str(e)) from None
        ignore = GitIgnore.for_walk(ws, rp.path)
        lines: list[str] = []
        deadline = time.monotonic() + TIMEOUT_S
        if rp.lstat is not None and os.path.isfile(rp.path):
            with fdwalk.open_file(ws, rp.path) as (fd, st):
                if st.st_size <= MAX_FILE_BYTES:
                    _search_fd(fd, ws.display(rp.path), regex, lines)
            return lines, 0

        def wanted(entry: fdwalk.Entry) -> bool:
            # Like rg --glob: a pattern without '/' matches the file name anywhere.
            if g is None:
                return True
            subject = entry.name if "/" not in (glob or "") else entry.rel
            return g.fullmatch(subject) is not None

        stats = fdwalk.WalkStats()
        for entry in fdwalk.walk(ws, rp.path, skip_dirs=SKIP_DIRS, stats=stats):
            if len(lines) > MAX_MATCHES or time.monotonic() > deadline:
                break
            if entry.kind != "file" or not wanted(entry) or ignore.ignored(entry.path):
                continue
            fd = fdwalk.open_entry_file(entry)
            if fd is None:
                continue
            try:
                if os.fstat(fd).st_size <= MAX_FILE_BYTES:
                    _search_fd(fd, ws.display(entry.path), regex, lines)
            except OSError:
                pass
            finally:
                os.close(fd)
        return lines, stats.secret_skipped


def _search_fd(fd: int, shown: str, regex: re.Pattern[str], lines: list[str]) -> None:
    with os.fdopen(os.dup(fd), "rb") as f:
        if looks_binary(f.read(BINARY_SNIFF_BYTES)):
            return
        f.seek(0)
        for n, raw in enumerate(f, 1):
            text = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            if regex.search(text):
                lines.append(_cut(f"{shown}:{n}:{text}"))
                if len(lines) > MAX_MATCHES:
                    return


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS + 200 else line[: MAX_LINE_CHARS + 200] + " [... line cut]"
