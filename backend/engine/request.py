"""Requests, their events and their streams: the typed hand-off between the engine and its users.

A `RequestStream` is filled by the engine thread and read either from plain threads
(`for ev in stream`) or from asyncio (`async for ev in stream`): the engine wakes asyncio readers
with `call_soon_threadsafe`, so no reader thread is needed per stream.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from mkcode.backend.sampling import SamplingParams
from mkcode.backend.usage import SpecUsage as SpecUsage  # re-exported for the engine
from mkcode.backend.usage import Usage

FinishReason = Literal["stop", "length", "cancelled", "error"]
_ids = itertools.count(1)


class TokenConstraint(Protocol):
    """Restricts which tokens may be sampled next (grammar-constrained decoding, e.g. JSON schema or
    tool-call syntax). Called on the engine thread only."""

    def allowed_tokens(self, vocab_size: int) -> torch.Tensor | None:
        """A bool mask [vocab_size] of the tokens allowed next, or None for no restriction."""
        ...

    def advance(self, token_id: int) -> None:
        """The token the engine sampled (always one the mask allowed)."""
        ...

    def is_finished(self) -> bool:
        """True when the grammar is complete: the request then stops with reason "stop"."""
        ...


class RequestError(ValueError):
    """A request the engine refuses (empty prompt, prompt over the context, bad parameters)."""


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    constraint: TokenConstraint | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_ids, list) or not self.prompt_ids:
            raise RequestError("empty prompt: a request needs at least one prompt token")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in self.prompt_ids):
            raise RequestError("prompt_ids must be a list of integers")


@dataclass
class TokenEvent:
    """New tokens and the text they completed (text may be empty while UTF-8 or a possible stop
    string is held back)."""

    token_ids: list[int]
    text: str


@dataclass
class FinishEvent:
    reason: FinishReason
    usage: Usage
    error: str | None = None


Event = TokenEvent | FinishEvent


@dataclass
class Completion:
    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    usage: Usage
    error: str | None = None


class RequestStream:
    """Events of one request, in order; ends with exactly one FinishEvent."""

    def __init__(self, request_id: str, cancel: callable):
        self.request_id = request_id
        self._cancel = cancel
        self._events: deque[Event] = deque()
        self._cond = threading.Condition()
        self._done = False
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    # engine side ------------------------------------------------------------------------------
    def put(self, ev: Event) -> None:
        with self._cond:
            if self._done:
                return
            self._events.append(ev)
            if isinstance(ev, FinishEvent):
                self._done = True
            self._cond.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut)

    @property
    def finished(self) -> bool:
        return self._done

    # reader side ------------------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancel(self.request_id)

    def get(self, timeout: float | None = None) -> Event:
        with self._cond:
            if not self._events and not self._cond.wait_for(lambda: bool(self._events), timeout):
                raise TimeoutError(f"no event from {self.request_id} within {timeout}s")
            return self._events.popleft()

    def __iter__(self):
        while True:
            ev = self.get()
            yield ev
            if isinstance(ev, FinishEvent):
                return

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                ev = self._events.popleft() if self._events else None
                if ev is None:
                    fut = loop.create_future()
                    self._async_waiters.append((loop, fut))
            if ev is None:
                await fut
                continue
            yield ev
            if isinstance(ev, FinishEvent):
                return

    def result(self, timeout: float | None = None) -> Completion:
        """Block until the request finishes; return everything it produced."""
        ids: list[int] = []
        parts: list[str] = []
        while True:
            ev = self.get(timeout)
            if isinstance(ev, TokenEvent):
                ids += ev.token_ids
                parts.append(ev.text)
            else:
                return Completion(self.request_id, ids, "".join(parts), ev.reason, ev.usage, ev.error)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
