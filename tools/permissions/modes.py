"""Permission modes: how much the agent may do without asking."""

from __future__ import annotations

from enum import StrEnum


class PermissionMode(StrEnum):
    ASK = "ask"  # reads free; edits and shell commands ask
    AUTO_EDIT = "auto-edit"  # reads and edits free; shell commands ask
    FULL_AUTO = "full-auto"  # everything free; shell commands still run in the sandbox

    @classmethod
    def parse(cls, value: str | PermissionMode) -> PermissionMode:
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown permission mode {value!r} (choose from {names})") from None
