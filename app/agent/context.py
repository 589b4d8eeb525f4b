"""Context management: fitting tool output and history into the model's context window.

Two tools, used in this order as the conversation grows (OpenCode and Claude Code do the same):
1. `truncate_output`: a single tool output longer than the limit keeps its head and tail.
2. `elide_tool_outputs` / `split_for_compaction`: near the limit, old tool outputs are replaced by a
   stub first (cheap, keeps every message); if that is not enough the older turns are summarised
   by the model (`compaction.Compactor`) and replaced by the summary.
"""

from __future__ import annotations

import copy
import json
from typing import Any

ELIDED = "[tool output removed to save context; call the tool again if you need it]"
SUMMARY_PREFIX = "[Summary of the earlier conversation, written when the context filled up]\n"


def truncate_output(text: str, limit: int) -> tuple[str, bool]:
    """Keep the first and last parts of `text` (two thirds head, one third tail) within `limit`."""
    if limit <= 0 or len(text) <= limit:
        return text, False
    marker = "\n[... {n} characters omitted ...]\n"
    room = max(0, limit - len(marker) - 8)
    head = text[: room * 2 // 3]
    tail = text[len(text) - (room - len(head)) :] if room > len(head) else ""
    omitted = len(text) - len(head) - len(tail)
    return head + marker.format(n=omitted) + tail, True


def user_turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "user"]


def recent_cut(messages: list[dict[str, Any]], keep_turns: int) -> int:
    """Index where the last `keep_turns` user turns begin (0 when there are no more than that)."""
    starts = user_turn_starts(messages)
    if len(starts) <= keep_turns:
        return 0
    return starts[-keep_turns] if keep_turns > 0 else len(messages)


def elide_tool_outputs(messages: list[dict[str, Any]], before: int) -> tuple[list[dict[str, Any]], int]:
    """Copy of `messages` with the content of tool messages before index `before` replaced by a stub;
    returns it and how many were elided."""
    out = copy.deepcopy(messages)
    n = 0
    for m in out[:before]:
        if (
            m.get("role") == "tool"
            and m.get("content") != ELIDED
            and len(str(m.get("content", ""))) > len(ELIDED)
        ):
            m["content"] = ELIDED
            n += 1
    return out, n


def transcript(messages: list[dict[str, Any]], max_chars: int) -> str:
    """Plain-text rendering of messages for the summariser (long contents shortened)."""
    lines: list[str] = []
    per = max(200, max_chars // max(1, len(messages)))
    for m in messages:
        role = m.get("role", "?")
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        content, _ = truncate_output(content, per)
        if m.get("tool_calls"):
            calls = ", ".join(
                f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in m["tool_calls"]
            )
            content = (content + "\n" if content else "") + f"[tool calls: {calls}]"
        lines.append(f"{role.upper()}: {content}")
    text = "\n\n".join(lines)
    return truncate_output(text, max_chars)[0]


def mechanical_summary(messages: list[dict[str, Any]]) -> str:
    """A summary that needs no model: the user's requests, the tool calls made, the last answers.
    Used when the model's summary fails or comes back empty."""
    lines: list[str] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        if role == "user":
            lines.append(f"- The user asked: {truncate_output(content, 400)[0]}")
        elif role == "assistant":
            for c in m.get("tool_calls") or []:
                args = truncate_output(c["function"].get("arguments", ""), 160)[0]
                lines.append(f"  - called {c['function']['name']} {args}")
            if content and not m.get("tool_calls"):
                lines.append(f"  - answered: {truncate_output(content, 400)[0]}")
    return "\n".join(lines) or "(nothing of note)"


SUMMARY_INSTRUCTIONS = """\
Summarise the conversation below between a user and a coding assistant so that the assistant can
continue the work without it. Keep: the user's requests and constraints, files inspected or changed
(with paths), what was found, decisions made, commands run and their outcome, and what is left to do.
Be concise and factual; write plain text."""
