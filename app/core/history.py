"""A saved session as a list of things to show again (after `--resume`, `/resume` or `/undo`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mkcode.app.agent import Session

ATTACHMENT_MARK = '\n\n<file path="'


@dataclass(frozen=True)
class ShownUser:
    text: str


@dataclass(frozen=True)
class ShownAssistant:
    text: str
    reasoning: str


@dataclass(frozen=True)
class ShownTool:
    call_id: str
    name: str
    arguments: dict[str, Any] | str
    ok: bool
    output: str
    denied: bool
    diff: str | None


ShownItem = ShownUser | ShownAssistant | ShownTool


def user_text(content: Any) -> str:
    """A user message as the user typed it (attached `@file` contents left out)."""
    text = content if isinstance(content, str) else json.dumps(content)
    return text.split(ATTACHMENT_MARK, 1)[0]


def shown_items(session: Session) -> list[ShownItem]:
    """The current history (`session.messages`), with each tool call's recorded outcome."""
    outcomes = {r["call_id"]: r for r in session.tool_calls()}
    items: list[ShownItem] = []
    for m in session.messages:
        role = m.get("role")
        if role == "user":
            items.append(ShownUser(user_text(m.get("content", ""))))
        elif role == "assistant":
            text, reasoning = m.get("content") or "", m.get("reasoning_content") or ""
            if text or reasoning:
                items.append(ShownAssistant(text, reasoning))
            for call in m.get("tool_calls") or []:
                rec = outcomes.get(call["id"], {})
                args: dict[str, Any] | str = rec.get("arguments", call["function"].get("arguments", ""))
                meta = rec.get("meta") or {}
                items.append(
                    ShownTool(
                        call["id"],
                        call["function"]["name"],
                        args,
                        bool(rec.get("ok", False)),
                        str(rec.get("output", "")),
                        bool(rec.get("denied", False)),
                        meta.get("diff") if isinstance(meta.get("diff"), str) else None,
                    )
                )
    return items
