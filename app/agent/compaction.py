"""Keeping the conversation inside the model's context window: the `Compactor`.

Before every model call the agent asks `Compactor.run(tools)`. When the prompt plus the answer's
reserve would pass `AgentConfig.compact_at` of the window, it frees room in this order (what
OpenCode and Claude Code do too):
1. old tool outputs (before the last `keep_recent_turns` user turns) become a stub: cheap, keeps
   every message;
2. if that is not enough, the older turns are summarised by the model (a mechanical summary when
   the model's fails) and replaced by the summary;
3. when everything is recent, only the current turn is kept, and its own older tool outputs thinned.
`run(tools, force=True)` is the `/compact` command. Token counts are taken in a worker thread (the
in-process client renders and tokenises: CPU work that must stay off the UI's event loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mkcode.app.agent import context as ctx
from mkcode.app.agent.client import ChatRequest, EngineClient, ModelDone, TextDelta
from mkcode.app.agent.config import AgentConfig
from mkcode.app.agent.events import Notice
from mkcode.app.agent.session import Session


class Compactor:
    """Compacts one session's history for one client (see the module docstring)."""

    def __init__(
        self, client: EngineClient, config: AgentConfig, session: Session, system_prompt: Callable[[], str]
    ) -> None:
        self.client = client
        self.config = config
        self.session = session
        self.system_prompt = system_prompt

    async def _over_budget(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[bool, int]:
        system = [{"role": "system", "content": self.system_prompt()}]
        tokens = await asyncio.to_thread(self.client.count_tokens, system + messages, tools)
        reserve = min(self.config.max_tokens, self.client.context_window // 4)
        limit = int(self.client.context_window * self.config.compact_at)
        return tokens + reserve > limit, tokens

    async def run(self, tools: list[dict[str, Any]], *, force: bool = False) -> Notice | None:
        """Compact if needed (always with `force`); what was done, or None."""
        messages = self.session.messages
        over, before = await self._over_budget(messages, tools)
        if not over and not force:
            return None
        cut = ctx.recent_cut(messages, self.config.keep_recent_turns)
        # 1. Old tool outputs go first (cheap, keeps every message).
        elided, n = ctx.elide_tool_outputs(messages, cut)
        over, after = await self._over_budget(elided, tools)
        if n and not over and not force:
            msg = f"context: removed {n} old tool outputs ({before} → {after} tokens)"
            self.session.record_compaction("", elided, before, after)
            return Notice("compacted", msg)
        # 2. Summarise the turns before the recent ones.
        if cut == 0 and over:
            # Everything is recent: keep only the current turn, and thin its own older tool outputs.
            cut = ctx.recent_cut(messages, 1)
        if cut == 0:
            if n:
                self.session.record_compaction("", elided, before, after)
                return Notice(
                    "compacted", f"context: removed {n} old tool outputs ({before} → {after} tokens)"
                )
            if over:
                thinned, n2 = ctx.elide_tool_outputs(messages, max(0, len(messages) - 2))
                if n2:
                    _, after = await self._over_budget(thinned, tools)
                    self.session.record_compaction("", thinned, before, after)
                    return Notice("compacted", f"context: removed {n2} tool outputs of this turn")
            return None
        old, recent = messages[:cut], messages[cut:]
        summary = await self._summarise(old)
        new = [{"role": "user", "content": ctx.SUMMARY_PREFIX + summary}, *recent]
        _, after = await self._over_budget(new, tools)
        self.session.record_compaction(summary, new, before, after)
        return Notice(
            "compacted", f"context: summarised {len(old)} earlier messages ({before} → {after} tokens)"
        )

    async def _summarise(self, old: list[dict[str, Any]]) -> str:
        """Ask the model for a summary of `old`; fall back to a mechanical one."""
        budget_chars = max(2000, self.client.context_window * 2)  # about half the window in tokens
        request = ChatRequest(
            messages=[
                {"role": "system", "content": ctx.SUMMARY_INSTRUCTIONS},
                {"role": "user", "content": ctx.transcript(old, budget_chars)},
            ],
            tools=[],
            max_tokens=min(1024, max(64, self.client.context_window // 8)),
            temperature=0.0,
        )
        parts: list[str] = []
        ok = False
        try:
            prompt = await asyncio.to_thread(self.client.count_tokens, request.messages, [])
            if prompt + request.max_tokens < self.client.context_window:
                async for ev in self.client.stream(request):
                    if isinstance(ev, TextDelta):
                        parts.append(ev.text)
                    elif isinstance(ev, ModelDone):
                        ok = ev.finish_reason in ("stop", "length")
                        if ev.usage.total_tokens:
                            self.session.record_usage(ev.usage)
        except Exception:
            ok = False
        summary = "".join(parts).strip()
        if not ok or len(summary) < 20:
            summary = ctx.mechanical_summary(old)
        return summary
