"""The FastAPI application of `mkcode serve`: a thin HTTP layer over an already-built engine.

    app = create_app(runtime)                       # a Runtime from build_runtime
    app = create_app(engine=e, tokenizer=t)         # or the parts (tests)

The engine thread is started here if it is not running; the caller owns shutdown.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from mkcode.backend.server import chat, completions, responses
from mkcode.backend.server.errors import APIError, install_error_handlers
from mkcode.backend.server.guards import ApiKeyMiddleware, BodyLimitMiddleware, ResponseCounter
from mkcode.backend.server.metrics import prometheus_text
from mkcode.backend.server.options import ServerOptions
from mkcode.backend.server.state import ServerState

_COUNTED = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models"}


def create_app(
    runtime: Any | None = None,
    *,
    engine: Any | None = None,
    tokenizer: Any | None = None,
    options: ServerOptions | None = None,
) -> FastAPI:
    if runtime is not None:
        engine = engine or runtime.engine
        tokenizer = tokenizer or runtime.tokenizer
    if engine is None or tokenizer is None:
        raise ValueError("create_app needs a Runtime, or both engine= and tokenizer=")
    options = options or ServerOptions()
    state = ServerState.build(engine, tokenizer, options)
    engine.start()

    app = FastAPI(title="mkcode", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.mkcode = state
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(responses.router)

    @app.get("/health")
    async def health():
        thread = getattr(engine, "_thread", None)
        alive = thread is None or thread.is_alive()
        return {"status": "ok" if alive else "engine stopped", "model": state.model_name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != state.model_name:
            raise APIError(
                404,
                f"model {model_id!r} does not exist; this server serves {state.model_name!r}",
                param="model",
                code="model_not_found",
            )
        return _model_card(state)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus_text(state), media_type="text/plain; version=0.0.4")

    def count(path: str, status: int) -> None:
        if path in _COUNTED:
            state.requests_total[(path, status)] = state.requests_total.get((path, status), 0) + 1

    # The last added runs first: the key check, then the body limit (bad keys and oversize bodies
    # are refused before anything parses them), then the count of what reaches the routes.
    app.add_middleware(ResponseCounter, on_response=count)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=options.max_body_bytes)
    if options.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=options.api_key)
    return app


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "mkcode",
        "max_model_len": state.max_model_len,
    }
