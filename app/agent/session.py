"""A conversation on record: the chat messages, every tool call and permission decision, usage.

The session is an append-only list of records; `messages` (what the next model call sees) is kept
alongside and is rebuilt from the records on load, compaction included. On disk it is JSONL, one
record per line, first line a header:

    {"type": "session", "id": ..., "created": ..., "cwd": ..., "model": ..., "version": 1}
    {"type": "message", "time": ..., "message": {"role": "user", "content": "..."}}
    {"type": "tool_call", "time": ..., "call_id": ..., "name": ..., "arguments": ..., "ok": ..., ...}
    {"type": "permission", "time": ..., "call_id": ..., "tool": ..., "decision": "allow_once", ...}
    {"type": "usage", "time": ..., "prompt_tokens": ..., "completion_tokens": ..., ...}
    {"type": "compaction", "time": ..., "summary": ..., "messages": [...]}   # replaces `messages`

`save(path)` appends only records not yet written, so a session can be flushed after every turn.
"""

from __future__ import annotations

import copy
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkcode.app.agent.events import Usage

SESSION_FORMAT_VERSION = 1


@dataclass
class Session:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    created: float = field(default_factory=time.time)
    cwd: str = field(default_factory=os.getcwd)
    model: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    _saved: int = field(default=0, repr=False)  # records already written by save()
    _saved_path: Path | None = field(default=None, repr=False)

    # -- recording -------------------------------------------------------------------------------

    def add_message(self, message: dict[str, Any]) -> None:
        """Append a chat message (to the history the model sees, and to the record)."""
        message = copy.deepcopy(message)
        self.messages.append(message)
        self._record("message", message=copy.deepcopy(message))

    def record_tool_call(
        self,
        call_id: str,
        name: str,
        arguments: Any,
        *,
        ok: bool,
        output: str,
        error: str | None = None,
        denied: bool = False,
        interrupted: bool = False,
        duration_s: float = 0.0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self._record(
            "tool_call",
            call_id=call_id,
            name=name,
            arguments=arguments,
            ok=ok,
            output=output,
            error=error,
            denied=denied,
            interrupted=interrupted,
            duration_s=round(duration_s, 4),
            meta=_jsonable(meta or {}),
        )

    def record_permission(
        self,
        call_id: str,
        tool: str,
        decision: str,
        *,
        reason: str = "",
        rule: str | None = None,
        message: str = "",
    ) -> None:
        self._record(
            "permission",
            call_id=call_id,
            tool=tool,
            decision=decision,
            reason=reason,
            rule=rule,
            message=message,
        )

    def record_usage(self, usage: Usage) -> None:
        self.usage.add(usage)
        self._record("usage", **usage.to_dict())

    def record_compaction(
        self, summary: str, messages: list[dict[str, Any]], tokens_before: int, tokens_after: int
    ) -> None:
        """Replace the history with `messages` (which carry the summary), keeping the record."""
        self.messages = copy.deepcopy(messages)
        self._record(
            "compaction",
            summary=summary,
            messages=copy.deepcopy(messages),
            tokens_before=tokens_before,
            tokens_after=tokens_after,
        )

    def record_event(self, record_type: str, /, **data: Any) -> None:
        """Anything else worth keeping (interruptions, errors, notices, system prompts)."""
        self._record(record_type, **data)

    def _record(self, record_type: str, /, **data: Any) -> None:
        self.records.append({"type": record_type, "time": time.time(), **data})

    # -- JSONL ------------------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        return {
            "type": "session",
            "id": self.id,
            "created": self.created,
            "cwd": self.cwd,
            "model": self.model,
            "version": SESSION_FORMAT_VERSION,
        }

    def to_jsonl(self) -> str:
        lines = [json.dumps(self.header(), ensure_ascii=False)]
        lines += [json.dumps(r, ensure_ascii=False) for r in self.records]
        return "\n".join(lines) + "\n"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the session to `path`: the whole file the first time, then only new records."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if self._saved_path != p or not p.exists():
            p.write_text(self.to_jsonl(), encoding="utf-8")
        else:
            with p.open("a", encoding="utf-8") as f:
                for r in self.records[self._saved :]:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
        self._saved, self._saved_path = len(self.records), p
        return p

    @classmethod
    def from_jsonl(cls, text: str) -> Session:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        if not lines or lines[0].get("type") != "session":
            raise ValueError("not an mkcode session: the first line must be a session header")
        head = lines[0]
        s = cls(id=head["id"], created=head["created"], cwd=head.get("cwd", ""), model=head.get("model", ""))
        for r in lines[1:]:
            s.records.append(r)
            kind = r.get("type")
            if kind == "message":
                s.messages.append(copy.deepcopy(r["message"]))
            elif kind == "compaction":
                s.messages = copy.deepcopy(r["messages"])
            elif kind == "usage":
                s.usage.add(
                    Usage(r.get("prompt_tokens", 0), r.get("completion_tokens", 0), r.get("cached_tokens", 0))
                )
        return s

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Session:
        s = cls.from_jsonl(Path(path).read_text(encoding="utf-8"))
        s._saved, s._saved_path = len(s.records), Path(path)
        return s

    # -- views --------------------------------------------------------------------------------------

    def tool_calls(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "tool_call"]

    def permissions(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "permission"]


def _jsonable(obj: Any) -> Any:
    """Tool meta may hold anything; keep what JSON can carry, stringify the rest."""
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        if isinstance(obj, dict):
            return {str(k): _jsonable(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [_jsonable(v) for v in obj]
        return str(obj)
