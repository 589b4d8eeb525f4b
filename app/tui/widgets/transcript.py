"""The conversation view: a scrolling column of prompts, answers, reasoning, tool cards and notes.

It is anchored: while the user has not scrolled up, new content keeps it pinned to the bottom;
scrolling up releases the anchor until the user scrolls back to the end.
"""

from __future__ import annotations

from typing import Any

from textual.containers import VerticalScroll
from textual.widget import Widget

from mkcode.app.agent import ToolCallFinished
from mkcode.app.core.history import ShownAssistant, ShownItem, ShownTool, ShownUser
from mkcode.app.tui.widgets.assistant_text import AssistantText
from mkcode.app.tui.widgets.notes import Note, UserPrompt
from mkcode.app.tui.widgets.reasoning import Reasoning
from mkcode.app.tui.widgets.tool_card import ToolCard


class Transcript(VerticalScroll):
    DEFAULT_CSS = """
    Transcript { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answer: AssistantText | None = None  # the answer being streamed
        self.reasoning: Reasoning | None = None
        self.cards: dict[str, ToolCard] = {}

    def on_mount(self) -> None:
        self.anchor()

    def _add(self, widget: Widget) -> Widget:
        self.mount(widget)
        return widget

    # -- the live turn ---------------------------------------------------------------------------

    def add_user(self, text: str) -> None:
        self._add(UserPrompt(text))

    def add_note(self, text: str, kind: str = "info") -> None:
        self._add(Note(text, kind))

    def append_text(self, text: str) -> None:
        if self.reasoning is not None:
            self.reasoning.finish()
            self.reasoning = None
        if self.answer is None:
            self.answer = AssistantText()
            self._add(self.answer)
        self.answer.add_fragment(text)

    def append_reasoning(self, text: str) -> None:
        if self.reasoning is None:
            self.reasoning = Reasoning()
            self._add(self.reasoning)
        self.reasoning.append(text)

    async def end_message(self) -> None:
        """The current assistant message is complete (a tool call or the end of the turn)."""
        if self.answer is not None:
            await self.answer.finish()
            self.answer = None
        if self.reasoning is not None:
            self.reasoning.finish()
            self.reasoning = None

    def start_tool(self, call_id: str, name: str, arguments: dict[str, Any] | str) -> ToolCard:
        card = ToolCard(call_id, name, arguments)
        self.cards[call_id] = card
        self._add(card)
        return card

    def finish_tool(self, ev: ToolCallFinished) -> None:
        card = self.cards.get(ev.call_id) or self.start_tool(ev.call_id, ev.name, {})
        card.finish(ev)

    # -- rebuilding ------------------------------------------------------------------------------

    async def clear(self) -> None:
        self.answer = self.reasoning = None
        self.cards.clear()
        await self.remove_children()

    async def replay(self, items: list[ShownItem]) -> None:
        """Show a saved conversation (resume, undo)."""
        widgets: list[Widget] = []
        for item in items:
            if isinstance(item, ShownUser):
                widgets.append(UserPrompt(item.text))
            elif isinstance(item, ShownAssistant):
                if item.reasoning:
                    widgets.append(Reasoning(item.reasoning, done=True))
                if item.text:
                    widgets.append(AssistantText(item.text))
            elif isinstance(item, ShownTool):
                card = ToolCard(item.call_id, item.name, item.arguments)
                card.state = "ok" if item.ok else ("denied" if item.denied else "failed")
                self.cards[item.call_id] = card
                widgets.append(card)
        if widgets:
            await self.mount_all(widgets)
        for item in items:
            if isinstance(item, ShownTool) and item.call_id in self.cards:
                self.cards[item.call_id].show_body(item.ok, item.output, item.diff)
        self.scroll_end(animate=False)
