"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status.

Every refusal the server makes goes through `APIError`, so clients (the openai SDK, the AI SDK)
get the body they parse, and bad input is always a 4xx, never a 5xx.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("mkcode.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    err_type = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None):
    headers = {"x-should-retry": "false"} if status < 500 else None
    return JSONResponse(error_body(status, message, param=param, code=code), status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None, str | None]:
    """One readable line per problem: `messages.0.role: Input should be ...`."""
    parts, first_param, code = [], None, None
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            code = "invalid_json"
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})")
            continue
        param = ".".join(loc) or None
        first_param = first_param or param
        parts.append(f"{param}: {err.get('msg')}" if param else str(err.get("msg")))
    return "; ".join(parts) or "invalid request", first_param, code


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc.status, exc.message, param=exc.param, code=exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        message, param, code = _describe_validation(exc)
        return error_response(400, message, param=param, code=code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))


class CatchAllMiddleware:
    """The last line: any exception a route lets escape is logged and answered with an OpenAI-shaped
    500, and the connection stays usable.

    Starlette's own handler for `Exception` answers and then re-raises, and uvicorn closes the
    keep-alive connection on that (the client's next request fails with a reset). Here the error
    ends with the request. If the response had already started (a stream), it is ended cleanly.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = False

        async def tracking_send(message: Message) -> None:
            nonlocal started, ended
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
            try:
                if not started:
                    body = json.dumps(
                        error_body(500, f"internal server error ({type(exc).__name__}); see the server log")
                    ).encode()
                    headers = [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ]
                    await send({"type": "http.response.start", "status": 500, "headers": headers})
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                elif not ended:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass  # the client is gone too
