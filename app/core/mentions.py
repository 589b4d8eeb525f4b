"""`@file` mentions: completing workspace paths, and attaching the mentioned files to a prompt.

A mention is `@` followed by a relative path, at the start of the prompt or after whitespace
(so e-mail addresses are left alone). On submit, every mention of an existing text file is attached
after the prompt, in a fenced block the model can read, up to `MAX_ATTACH_BYTES` per file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MAX_ATTACH_BYTES = 64_000
MAX_FILES_LISTED = 20_000
SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache",
             ".ruff_cache", ".pytest_cache", "build", "dist", ".tox", ".idea"}  # fmt: skip
MENTION = re.compile(r"(?:(?<=\s)|^)@([\w./\-+~]+)")


class FileIndex:
    """The workspace's files (relative paths), listed once and refreshed on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: list[str] | None = None

    def files(self) -> list[str]:
        if self._files is None:
            self._files = _walk(self.root)
        return self._files

    def refresh(self) -> None:
        self._files = None

    def complete(self, fragment: str, limit: int = 12) -> list[str]:
        """Paths for `@fragment`: prefix matches first, then paths containing the fragment."""
        files = self.files()
        if not fragment:
            return files[:limit]
        low = fragment.lower()
        prefix = [f for f in files if f.lower().startswith(low)]
        inside = [f for f in files if low in f.lower() and f not in prefix]
        return (prefix + inside)[:limit]


def _walk(root: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(filenames):
            out.append(name if rel_dir == "." else f"{rel_dir}/{name}")
            if len(out) >= MAX_FILES_LISTED:
                return out
    return out


def mention_at_cursor(text: str) -> str | None:
    """The `@fragment` being typed at the end of `text` (without the @), or None."""
    m = re.search(r"(?:^|\s)@([\w./\-+~]*)$", text)
    return m.group(1) if m else None


def mentioned_paths(prompt: str) -> list[str]:
    seen: list[str] = []
    for m in MENTION.finditer(prompt):
        path = m.group(1).rstrip(".,;:")
        if path not in seen:
            seen.append(path)
    return seen


def expand_mentions(prompt: str, root: Path) -> str:
    """The prompt with the mentioned files' contents attached (unknown mentions are left as text)."""
    blocks = []
    root_resolved = root.resolve()
    for rel in mentioned_paths(prompt):
        path = (root / rel).resolve()
        if not path.is_file() or not path.is_relative_to(root_resolved):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:4096]:
            continue  # binary: the model cannot use it
        text = data[:MAX_ATTACH_BYTES].decode("utf-8", "replace")
        cut = "\n[… truncated]" if len(data) > MAX_ATTACH_BYTES else ""
        blocks.append(f'<file path="{rel}">\n{text}{cut}\n</file>')
    if not blocks:
        return prompt
    return prompt + "\n\n" + "\n\n".join(blocks)
