"""The audit log: every tool call, the permission decision, who made it, and the outcome."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mkcode.tools.text import clean_text

# Argument strings longer than this are shortened in the log (with their sha256).
MAX_LOGGED_ARG_CHARS = 2000


@dataclass(frozen=True)
class AuditEntry:
    time: float  # Unix time the call started
    tool: str
    args: dict[str, Any]
    kind: str | None  # read / edit / shell; None for an unknown tool
    decision: str  # "allowed" | "denied" | "invalid" (never reached the policy)
    decided_by: str  # "mode:ask", "rule:run_shell(git status *)", "user:once", "user:always",
    #                  "user:deny", "non-interactive", "setting:dangerously_no_sandbox", ...
    ok: bool | None = None  # None when it did not run
    error: str | None = None
    sandboxed: bool | None = None  # for run_shell
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _shorten(value: Any) -> Any:
    if isinstance(value, str):
        value = clean_text(value)
        if len(value) > MAX_LOGGED_ARG_CHARS:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]
            return f"{value[:MAX_LOGGED_ARG_CHARS]}... [{len(value)} chars, sha256 {digest}]"
    return value


def loggable_args(args: Any) -> dict[str, Any]:
    if not isinstance(args, dict):
        return {"_raw": _shorten(repr(args))}
    return {clean_text(str(k)): _shorten(v) for k, v in args.items()}


class AuditLog:
    """In-memory list of entries; the session can persist it (JSONL) or subscribe to it."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.entries: list[AuditEntry] = []
        self.path = os.fspath(path) if path is not None else None
        self._listeners: list[Callable[[AuditEntry], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, listener: Callable[[AuditEntry], None]) -> None:
        self._listeners.append(listener)

    def record(self, entry: AuditEntry) -> None:
        with self._lock:
            self.entries.append(entry)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry.to_dict(), ensure_ascii=False) + "\n")
        for listener in self._listeners:
            listener(entry)

    def to_jsonl(self) -> str:
        return "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in self.entries)

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_jsonl())


def now() -> float:
    return time.time()
