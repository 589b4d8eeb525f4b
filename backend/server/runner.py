"""Running the app under uvicorn: in the foreground (`mkcode serve`) or in a thread (tests, TUI)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def uvicorn_config(app: Any, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    # h11 keeps the dependency set small; no uvloop/httptools needed. Keep-alive connections of idle
    # agents are closed after 30 s.
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, http="h11", timeout_keep_alive=30, lifespan="off"
    )


class ServerThread:
    """uvicorn serving `app` on a background thread; `with ServerThread(app) as s: s.base_url`."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning"
    ):
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(uvicorn_config(app, host, self.port, log_level))
        self.thread = threading.Thread(target=self.server.run, name="mkcode-http", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start on {self.base_url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(app: Any, host: str, port: int, log_level: str = "info") -> None:
    uvicorn.Server(uvicorn_config(app, host, port, log_level)).run()
