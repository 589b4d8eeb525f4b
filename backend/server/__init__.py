"""`mkcode serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the engine.

`create_app` and `ServerOptions` are loaded on first use, so that light modules of this package
(`options`, `client_config`) can be imported by the CLI without FastAPI or torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerOptions", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from mkcode.backend.server.app import create_app

        return create_app
    if name == "ServerOptions":
        from mkcode.backend.server.options import ServerOptions

        return ServerOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
