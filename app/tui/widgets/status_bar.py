"""The status line: model, backend, live decode speed, context used, GPU memory, permission mode."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static


@dataclass
class Status:
    model: str = ""
    backend: str = ""
    mode: str = "ask"
    tokens_per_s: float | None = None
    context_used: int = 0
    context_window: int = 0
    gpu_used_gb: float | None = None
    gpu_total_gb: float | None = None
    busy: bool = False
    hint: str = ""  # short transient message ("press Ctrl+C again to quit")
    spec: str = ""  # speculative decoding: "spec accepted/drafted"


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.status = Status()

    def show(self, status: Status) -> None:
        self.status = status
        self.update(render_status(status, self.size.width or 80))


def render_status(s: Status, width: int) -> Text:
    """Fields separated by " │ ", dropping the least important ones to fit `width`."""
    pct = 100 * s.context_used / s.context_window if s.context_window else 0.0
    fields: list[tuple[int, Text]] = [  # (priority: lower is dropped last, text)
        (0, Text(s.model, style="bold")),
        (4, Text(s.backend)),
        (1, Text(f"{s.tokens_per_s:.1f} tok/s" if s.tokens_per_s else "– tok/s")),
        (4, Text(s.spec)),
        (2, Text(f"ctx {pct:.0f}%", style="bold red" if pct >= 80 else "")),
        (
            5,
            Text(f"GPU {s.gpu_used_gb:.1f}/{s.gpu_total_gb:.0f} GB")
            if s.gpu_used_gb is not None
            else Text(""),
        ),
        (0, Text(f"mode {s.mode}", style="bold yellow" if s.mode != "ask" else "")),
        (3, Text("● working" if s.busy else "", style="bold green")),
        (0, Text(s.hint, style="bold")),
    ]
    shown = [(p, t) for p, t in fields if t.plain]
    sep = " │ "
    while shown and sum(len(t) for _, t in shown) + len(sep) * (len(shown) - 1) > width - 2:
        worst = max(range(len(shown)), key=lambda i: (shown[i][0], i))
        if shown[worst][0] == 0:
            break
        shown.pop(worst)
    return Text(sep, style="dim").join(t for _, t in shown)
