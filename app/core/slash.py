"""Slash commands: the one table both front ends complete, parse and list in `/help`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str  # argument synopsis, "" when none
    help: str


COMMANDS: tuple[SlashCommand, ...] = (
    SlashCommand("help", "", "show commands and key bindings"),
    SlashCommand("clear", "", "start a new session (the current one stays on disk)"),
    SlashCommand("compact", "", "summarise older turns to free context"),
    SlashCommand("mode", "[ask|auto-edit|full-auto]", "show or set the permission mode"),
    SlashCommand("model", "", "show the model and backend in use"),
    SlashCommand("sessions", "", "list saved sessions for this directory"),
    SlashCommand("resume", "[ID]", "resume a saved session (the latest when no ID)"),
    SlashCommand("undo", "", "restore the files the last turn changed, and the conversation"),
    SlashCommand("diff", "", "show what this session changed on disk"),
    SlashCommand("quit", "", "leave mkcode (the session is saved)"),
)
BY_NAME = {c.name: c for c in COMMANDS}
ALIASES = {"exit": "quit", "q": "quit", "?": "help", "new": "clear"}


@dataclass(frozen=True)
class ParsedCommand:
    name: str  # canonical name, or the unknown name as typed
    arg: str
    known: bool


def parse(text: str) -> ParsedCommand | None:
    """`/name args` -> ParsedCommand; None when the text is not a slash command."""
    text = text.strip()
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, arg = text[1:].partition(" ")
    name = ALIASES.get(name.lower(), name.lower())
    return ParsedCommand(name, arg.strip(), name in BY_NAME)


def complete(prefix: str) -> list[SlashCommand]:
    """Commands whose name starts with `prefix` (without the slash)."""
    prefix = prefix.lower()
    return [c for c in COMMANDS if c.name.startswith(prefix)]


def help_lines() -> list[str]:
    width = max(len(f"/{c.name} {c.usage}".strip()) for c in COMMANDS)
    return [f"{f'/{c.name} {c.usage}'.strip():<{width}}  {c.help}" for c in COMMANDS]
