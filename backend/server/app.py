"""The FastAPI application of `mkcode serve`: a thin HTTP layer over an already-built engine.

    app = create_app(runtime)                       # a Runtime from build_runtime
    app = create_app(engine=e, tokenizer=t)         # or the parts (tests)

The engine thread is started here if it is not running; the caller owns shutdown.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from mkcode.backend.server import chat, completions, openapi, responses
from mkcode.backend.server.errors import CatchAllMiddleware, install_error_handlers
from mkcode.backend.server.guards import ApiKeyMiddleware, BodyLimitMiddleware, ResponseCounter
from mkcode.backend.server.limits import max_token_bytes
from mkcode.backend.server.metrics import prometheus_text
from mkcode.backend.server.options import ServerOptions
from mkcode.backend.server.state import ServerState

# Paths counted under their own label in /metrics; anything else (a fuzzer's random paths) is "other".
_ROUTES = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/models",
    "/health",
    "/metrics",
    "/openapi.json",
}


def endpoint_label(path: str) -> str:
    if path in _ROUTES:
        return path
    return "/v1/models/{model}" if path.startswith("/v1/models/") else "other"


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

    app = FastAPI(
        title="mkcode",
        version=_version(),
        summary="OpenAI-compatible API of `mkcode serve` (Chat Completions, Completions, Responses)",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.mkcode = state
    install_error_handlers(app)
    openapi.install(app)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(responses.router)

    @app.get("/health", responses=openapi.HEALTH)
    async def health():
        thread = getattr(engine, "_thread", None)
        if thread is None or thread.is_alive():
            return {"status": "ok", "model": state.model_name}
        # a liveness probe must see the failure in the status, not only in the body
        return JSONResponse({"status": "engine stopped", "model": state.model_name}, status_code=503)

    @app.get("/v1/models", responses=openapi.MODELS)
    async def models():
        return {"object": "list", "data": [_model_card(state, name) for name in options.model_names]}

    @app.get("/v1/models/{model_id:path}", responses=openapi.MODEL)
    async def model(model_id: str):
        return _model_card(state, state.resolve_model(model_id))

    @app.get("/metrics", response_class=PlainTextResponse, responses=openapi.METRICS)
    async def metrics():
        return PlainTextResponse(prometheus_text(state), media_type="text/plain; version=0.0.4")

    def count(path: str, status: int) -> None:
        key = (endpoint_label(path), status)
        state.requests_total[key] = state.requests_total.get(key, 0) + 1

    # The last added runs first: the count of every response (the guards' 401 and 413 and the 500s
    # included), the key check, the body limit (bad keys and oversize bodies are refused before
    # anything parses them), then the catch-all around the routes.
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=options.max_body_bytes)
    if options.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=options.api_key)
    app.add_middleware(ResponseCounter, on_response=count)
    max_token_bytes(tokenizer)  # the prompt-size floor's table, built once before serving
    return app


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("mkcode")
    except Exception:
        return "0"


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "mkcode",
        "max_model_len": state.max_model_len,
    }
