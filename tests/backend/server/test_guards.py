"""backend/server/guards.py: the API-key check, the body limit and the response count, each alone
and stacked as create_app stacks them (the key is checked before any byte of the body is read, and
the count sees the guards' refusals too)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from mkcode.backend.server.guards import ApiKeyMiddleware, BodyLimitMiddleware, ResponseCounter

KEY = "sk-guard"


class Echo:
    """An ASGI app answering 200 with the size of the body it read; records the bodies."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        out = json.dumps({"read": len(body)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": out})


def _stack(app, counted: list) -> object:
    """create_app's order: the counter (sees every answer), the key check, the body limit, the routes."""
    guarded = ApiKeyMiddleware(BodyLimitMiddleware(app, max_body_bytes=100), api_key=KEY)
    return ResponseCounter(guarded, on_response=lambda path, status: counted.append((path, status)))


def _post(app, path: str, content, headers: dict | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post(path, content=content, headers=headers or {})

    return asyncio.run(go())


def _chunks(n: int):
    async def gen():
        for _ in range(n):
            yield b"x" * 40

    return gen()


def test_key_is_checked_before_the_body_is_read() -> None:
    app, counted = Echo(), []
    stack = _stack(app, counted)
    r = _post(stack, "/v1/chat/completions", b"x" * 500)  # no key and too big: 401, not 413
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "invalid_api_key"
    r = _post(stack, "/v1/models", b"{}", {"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert app.bodies == []  # the app never ran
    assert counted == [("/v1/chat/completions", 401), ("/v1/models", 401)]  # refusals are counted too
    counted.clear()
    r = _post(stack, "/v1/models", b"{}", {"x-api-key": KEY})
    assert r.status_code == 200 and r.json() == {"read": 2}
    r = _post(stack, "/health", b"")  # liveness needs no key
    assert r.status_code == 200
    assert counted == [("/v1/models", 200), ("/health", 200)]


def test_body_limit_on_declared_and_received_bytes() -> None:
    app, counted = Echo(), []
    stack = _stack(app, counted)
    auth = {"Authorization": f"Bearer {KEY}"}
    r = _post(stack, "/v1/completions", b"y" * 101, auth)
    assert r.status_code == 413 and "101 bytes" in r.json()["error"]["message"]
    r = _post(stack, "/v1/completions", _chunks(3), auth)  # no Content-Length: 120 bytes received
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert app.bodies == []
    r = _post(stack, "/v1/completions", _chunks(2), auth)  # 80 bytes in two chunks: replayed whole
    assert r.status_code == 200 and app.bodies == [b"x" * 80]
    assert counted == [("/v1/completions", 413), ("/v1/completions", 413), ("/v1/completions", 200)]


def test_each_guard_works_alone() -> None:
    app = Echo()
    assert _post(BodyLimitMiddleware(app, max_body_bytes=10), "/x", b"z" * 11).status_code == 413
    assert _post(ApiKeyMiddleware(app, api_key=KEY), "/x", b"z" * 11, {"x-api-key": KEY}).status_code == 200
    assert app.bodies == [b"z" * 11]  # no body limit without BodyLimitMiddleware
    with pytest.raises(ValueError, match="non-empty"):
        ApiKeyMiddleware(app, api_key="")
