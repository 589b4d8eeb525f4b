"""Rendering and tokenising a chat prompt, incrementally.

An agent sends the same history again on every model step, one or two messages longer each time;
the server gets the same from clients that resend the whole conversation. `PromptEncoder.encode`
gives exactly `ChatTokenizer.apply_chat_template(messages, tools)`, but tokenises only what it has not
seen: the rendered prompt is cut before every control token of the template (the tokenizer splits
its added tokens out before anything else, so the pieces tokenise independently), and each piece's
ids are cached. Pieces are about one message each, so a step costs one template render plus the
tokenisation of the new messages. The last whole prompt is cached too (counting the tokens and then
sending the same prompt renders once).

CPU work: call it from a worker thread (`asyncio.to_thread`), never on an event loop.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any


class PromptEncoder:
    """Cached `apply_chat_template` (sanitised, with the generation prompt) for one `ChatTokenizer`."""

    def __init__(self, tokenizer: Any, max_pieces: int = 8192) -> None:
        self.tokenizer = tokenizer
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._max_pieces = max_pieces
        self._last: tuple[str, list[int]] | None = None
        self._lock = threading.Lock()
        added = sorted(tokenizer._added, key=len, reverse=True)
        self._split_re = re.compile("(?=" + "|".join(re.escape(t) for t in added) + ")" if added else "(?!)")
        self.pieces_encoded = 0  # pieces tokenised so far (cache misses): for tests and stats

    def encode(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """The prompt's ids: `apply_chat_template(messages, tools or None, add_generation_prompt=True)`."""
        tok = self.tokenizer
        marked_messages = tok._mark(list(messages))
        marked_tools = tok._mark(list(tools)) if tools else None
        text = tok.render(marked_messages, marked_tools, True)
        with self._lock:
            if self._last is not None and self._last[0] == text:
                return list(self._last[1])
        ids: list[int] = []
        pos = 0
        for m in tok._marked_re.finditer(text):
            ids += self._encode_text(text[pos : m.start()])
            if m.group(1) is not None:  # a control token inside content: plain text, as the tokenizer does
                ids += tok.encode_plain(m.group(1))
            pos = m.end()
        ids += self._encode_text(text[pos:])
        with self._lock:
            self._last = (text, ids)
        return list(ids)

    def count(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        return len(self.encode(messages, tools))

    def _encode_text(self, text: str) -> list[int]:
        out: list[int] = []
        for piece in self._split_re.split(text):
            if not piece:
                continue
            with self._lock:
                ids = self._pieces.get(piece)
                if ids is not None:
                    self._pieces.move_to_end(piece)
            if ids is None:
                ids = self.tokenizer.encode(piece)
                with self._lock:
                    self.pieces_encoded += 1
                    self._pieces[piece] = ids
                    while len(self._pieces) > self._max_pieces:
                        self._pieces.popitem(last=False)
            out += ids
        return out
