"""`mkcode serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the engine."""

from mkcode.backend.server.app import create_app
from mkcode.backend.server.options import ServerOptions

__all__ = ["ServerOptions", "create_app"]
