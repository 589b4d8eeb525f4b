"""Prompt history shared by the TUI and the plain REPL: JSON lines in the data dir, newest last."""

from __future__ import annotations

import json
import os
from pathlib import Path

MAX_ENTRIES = 1000


class PromptHistory:
    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: in memory only (tests)
        self.entries: list[str] = self._load()

    def _load(self) -> list[str]:
        if self.path is None or not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines()[-MAX_ENTRIES:]:
            try:
                text = json.loads(line)
            except ValueError:
                continue
            if isinstance(text, str):
                out.append(text)
        return out

    def append(self, text: str) -> None:
        if not text.strip() or (self.entries and self.entries[-1] == text):
            return
        self.entries.append(text)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(text, ensure_ascii=False) + "\n").encode("utf-8"))
        finally:
            os.close(fd)
