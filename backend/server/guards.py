"""ASGI middlewares run before routing, each owning one concern: the API-key check, the
request-body size limit, and the response count for /metrics.

The first two answer with OpenAI error bodies. The size limit is enforced on the bytes actually received
(a client may lie about or omit Content-Length), by wrapping `receive`.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mkcode.backend.server.errors import error_body

OPEN_PATHS = ("/health",)  # liveness probes need no key


async def _send_error(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


class ApiKeyMiddleware:
    """Every HTTP request but OPEN_PATHS needs `Authorization: Bearer <key>` (or `x-api-key`)."""

    def __init__(self, app: ASGIApp, *, api_key: str) -> None:
        if not api_key:
            raise ValueError("ApiKeyMiddleware needs a non-empty key (leave it out to serve without one)")
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in OPEN_PATHS and not self._authorized(scope):
            await _send_error(
                send,
                401,
                "invalid or missing API key (send 'Authorization: Bearer <key>')",
                "invalid_api_key",
            )
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = _headers(scope)
        auth = headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
        return hmac.compare_digest(token.encode(), self.api_key.encode())


class BodyLimitMiddleware:
    """Refuses a request body over `max_body_bytes` (413) before the app sees any of it."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = _headers(scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_error(
                send,
                413,
                f"request body of {declared} bytes exceeds the limit of {limit} bytes",
                "request_too_large",
            )
            return
        # Read the whole body first (bounded), then replay it: the app sees a normal request, and
        # an oversize body is refused before any parsing. Later receive() calls go to the client
        # (that is how a disconnect is noticed while a response streams).
        chunks: list[bytes] = []
        received = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if message["type"] != "http.request":
                continue
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > limit:
                await _send_error(
                    send, 413, f"request body exceeds the limit of {limit} bytes", "request_too_large"
                )
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay_receive() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay_receive, send)


class ResponseCounter:
    """Calls `on_response(path, status)` as each HTTP response starts."""

    def __init__(self, app: ASGIApp, *, on_response: Callable[[str, int], None]) -> None:
        self.app = app
        self.on_response = on_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.on_response(path, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)
