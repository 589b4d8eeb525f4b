"""Textual messages that carry work done off the UI's hands: backend loading and agent events.

Workers never touch widgets: they post these, and the handlers (on the App and the chat screen)
own every change to the screen.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from mkcode.app.agent import AgentEvent
from mkcode.app.core.backend import Backend


@dataclass
class LoadProgress(Message):
    stage: str
    fraction: float | None


@dataclass
class BackendReady(Message):
    backend: Backend


@dataclass
class BackendFailed(Message):
    error: str


@dataclass
class AgentEventArrived(Message):
    """One event of the running turn, in order."""

    event: AgentEvent


@dataclass
class TurnEnded(Message):
    """The turn's worker is done (after its TurnFinished, or after it failed)."""

    error: str | None = None
