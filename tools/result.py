"""The typed result every tool call returns (never an exception to the agent loop)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mkcode.tools.text import clean_text


@dataclass(frozen=True)
class ToolResult:
    """Outcome of one tool call.

    `ok` is True when the tool did what was asked. `output` is the model-facing text (also set on
    some failures, e.g. a shell command's output when it exits non-zero). `error` says what went
    wrong. `denied` marks a call the permission policy or the user refused. `meta` carries
    structured details (diff, exit code, truncation flags) for the UI and the audit log.
    """

    ok: bool
    output: str = ""
    error: str | None = None
    denied: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Tool text ends up in JSON and in the tokenizer: it must be valid UTF-8 (no lone
        # surrogates from non-UTF-8 file names or content).
        object.__setattr__(self, "output", clean_text(self.output))
        if self.error is not None:
            object.__setattr__(self, "error", clean_text(self.error))
        object.__setattr__(self, "meta", _clean(self.meta))

    @classmethod
    def success(cls, output: str, **meta: Any) -> ToolResult:
        return cls(ok=True, output=output, meta=meta)

    @classmethod
    def failure(cls, error: str, output: str = "", **meta: Any) -> ToolResult:
        return cls(ok=False, output=output, error=error, meta=meta)

    @classmethod
    def refusal(cls, error: str, **meta: Any) -> ToolResult:
        return cls(ok=False, error=error, denied=True, meta=meta)

    def for_model(self) -> str:
        """The text to put in the tool message the model sees."""
        if self.ok:
            return self.output
        prefix = "Denied" if self.denied else "Error"
        text = f"{prefix}: {self.error}"
        if self.output:
            text += "\n" + self.output
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`mkcode tool` prints this)."""
        out: dict[str, Any] = {"ok": self.ok}
        if self.output or self.ok:
            out["output"] = self.output
        if self.error is not None:
            out["error"] = self.error
        if self.denied:
            out["denied"] = True
        if self.meta:
            out["meta"] = self.meta
        return out


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value
