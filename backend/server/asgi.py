"""Responses that notice a client going away, so its engine request is cancelled at once.

Starlette's StreamingResponse only notices a closed connection on its next write, which can be
long while a request waits in the queue. `SSEResponse` races the event pump against the client's
`http.disconnect`; `until_disconnect` does the same for a non-streaming handler's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


def sse_data(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_event(event: str, payload: Any) -> bytes:
    return f"event: {event}\n".encode() + sse_data(payload)


SSE_DONE = b"data: [DONE]\n\n"


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _race(work: Awaitable[T], receive: Receive) -> T:
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientGone."""
    return await _race(work, request.receive)


class SSEResponse(Response):
    """A text/event-stream response fed by an async iterator of encoded events."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]):
        super().__init__(
            content=None,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            media_type=self.media_type,
        )
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in self.raw_headers if k.lower() != b"content-length"]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})

        async def pump() -> None:
            async for chunk in self._events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await _race(pump(), receive)
        except (ClientGone, OSError):
            pass  # the generator's cleanup has cancelled the engine request
        finally:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                # Cancelled from outside (server shutdown, a test client's cancel scope) while the
                # pump task still runs the generator, aclose() raises RuntimeError: that task's
                # cancellation closes it, and the generator's own cleanup cancels the engine request.
                with contextlib.suppress(RuntimeError):
                    await aclose()
