"""A rich progress bar for byte-sized work (bytes done, GB/s, ETA), silent when nobody watches.

The bar is drawn on stderr only when `enabled` and stderr is a terminal, so logs, pipes and tests
stay clean.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class ByteProgress:
    """Context manager: `advance(nbytes)` moves the bar; a no-op when disabled or not a TTY."""

    def __init__(
        self,
        description: str,
        total_bytes: int,
        *,
        enabled: bool = True,
        callback: Callable[[int, int], None] | None = None,
    ) -> None:
        # callback(done_bytes, total_bytes): for UIs that draw their own bar (the TUI start screen)
        self._callback = callback
        self._done = 0
        self._total = total_bytes
        console = Console(stderr=True)
        self.active = enabled and console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.active:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(binary_units=False),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )
            self._task = self._progress.add_task(description, total=total_bytes)

    def __enter__(self) -> ByteProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        if self._callback is not None:
            self._callback(self._done, self._total)
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, nbytes)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
