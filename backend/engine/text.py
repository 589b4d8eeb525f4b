"""Per-request text output: incremental detokenisation plus stop-string handling.

Text that could be the beginning of a stop string is held back until it is known not to be one;
when a stop string completes, the text before it is released and the request stops. The
detokeniser itself guarantees that no UTF-8 character is ever split.
"""

from __future__ import annotations

from typing import Protocol


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str: ...
    def flush(self) -> str: ...


class TextAssembler:
    def __init__(self, detok: Detokenizer | None, stop: tuple[str, ...] = ()):
        self.detok = detok
        self.stop = stop
        self._held = ""  # text not yet released (possible stop-string prefix)
        self.stopped = False  # a stop string was found

    def push(self, token_id: int) -> str:
        """Feed one token; return newly releasable text ('' while held back)."""
        if self.detok is None or self.stopped:
            return ""
        return self._release(self.detok.push(token_id), final=False)

    def finish(self) -> str:
        """The request ended: release whatever is held (no stop string can complete now)."""
        if self.detok is None or self.stopped:
            return ""
        return self._release(self.detok.flush(), final=True)

    def _release(self, new: str, final: bool) -> str:
        text = self._held + new
        if not self.stop:
            self._held = ""
            return text
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        if final:
            self._held = ""
            return text
        keep = 0  # longest suffix of text that is a proper prefix of some stop string
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]
