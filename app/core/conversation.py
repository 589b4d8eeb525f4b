"""`Conversation`: one workspace's chat with the agent, as every front end drives it.

It owns the agent (and its tool registry), the session on disk and the undo checkpoints, and
implements the slash commands in a front-end-neutral way: `command("/mode auto-edit")` returns a
`CommandReply` that the TUI renders as widgets and the plain REPL prints. The session is saved
after every tool call and at the end of every turn. A session with no messages is never written
(`/clear` or `/quit` on an empty chat leaves no file), and the first turn of a new session that
fails (`TurnFinished(reason="error")`, or an exception) with no answer leaves none either.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mkcode.app.agent import Agent, AgentConfig, AgentEvent, Session, ToolCallFinished, TurnFinished
from mkcode.app.core import slash
from mkcode.app.core.backend import Backend
from mkcode.app.core.mentions import FileIndex, expand_mentions
from mkcode.app.core.sessions import SessionInfo, SessionStore
from mkcode.app.core.undo import SnapshottingRegistry, UndoResult, UndoStack, restore_files, session_diff
from mkcode.app.settings import MODES, Settings
from mkcode.tools import AllowRule, PermissionPolicy, SandboxSettings, Workspace


@dataclass
class CommandReply:
    """What a slash command did, for the front end to show."""

    text: str = ""  # Markdown-ish text to print (may be empty)
    kind: str = "info"  # info | error | help | diff | sessions
    quit: bool = False
    cleared: bool = False  # the transcript should be emptied (new session)
    resumed: bool = False  # the transcript should be rebuilt from `Conversation.session`
    sessions: list[SessionInfo] = field(default_factory=list)
    undo: UndoResult | None = None


class Conversation:
    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        *,
        cwd: Path,
        store: SessionStore,
        session: Session | None = None,
        interactive: bool = True,
        rules: Iterable[AllowRule] = (),
        agent_config: AgentConfig | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.cwd = cwd
        self.store = store
        self.interactive = interactive
        self.agent_config = agent_config or AgentConfig(max_tokens=settings.max_tokens)
        self.policy = PermissionPolicy(_mode(settings.mode), list(rules))
        self.files = FileIndex(cwd)
        self.undo_stack = UndoStack()
        self.context_tokens = 0
        self.started = time.time()
        self._agent = self._new_agent(session)
        if self.session.messages:  # --continue / --resume: the status bar shows the real use
            self.context_tokens = self._safe_context_tokens()

    # -- state ----------------------------------------------------------------------------------

    @property
    def agent(self) -> Agent:
        return self._agent

    @property
    def session(self) -> Session:
        return self._agent.session

    @property
    def registry(self) -> SnapshottingRegistry:
        return self._agent.tools  # type: ignore[return-value]

    @property
    def mode(self) -> str:
        return self.policy.mode.value

    @property
    def context_window(self) -> int:
        return self.backend.client.context_window

    @property
    def busy(self) -> bool:
        return self._agent.busy

    def _new_agent(self, session: Session | None) -> Agent:
        sandbox = SandboxSettings(
            dangerously_no_sandbox=self.settings.dangerously_no_sandbox,
            env_allow=self.settings.sandbox_env_allow,
            home_allow_ro=self.settings.sandbox_home_allow_ro,
        )
        registry = SnapshottingRegistry(Workspace(self.cwd), policy=self.policy, sandbox=sandbox)
        session = session or Session(cwd=str(self.cwd), model=self.backend.model_name)
        return Agent(
            self.backend.client,
            registry,
            config=self.agent_config,
            session=session,
            cwd=self.cwd,
            interactive=self.interactive,
        )

    def save(self) -> Path | None:
        """Write the session; None (nothing written) while it has no messages and no file yet."""
        if not self.session.messages and not self.store.path_for(self.session.id).exists():
            return None
        return self.store.save(self.session)

    # -- turns ----------------------------------------------------------------------------------

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Run one user turn (with `@file` mentions attached); yields the agent's events."""
        checkpoint = self.undo_stack.begin(prompt, len(self.session.messages))
        self.registry.checkpoint = checkpoint
        self.files.refresh()
        fresh = not self.session.messages and not self.store.path_for(self.session.id).exists()
        failed = True  # until the turn finishes other than with an error
        try:
            async for event in self._agent.run(expand_mentions(prompt, self.cwd)):
                if isinstance(event, TurnFinished):
                    self.context_tokens = event.context_tokens
                    failed = event.reason == "error"
                if isinstance(event, ToolCallFinished | TurnFinished):
                    self.save()
                yield event
        finally:
            self.registry.checkpoint = None
            if fresh and failed and not _answered(self.session.messages):
                self.store.discard(self.session.id)  # a failed first turn is not a session worth keeping
            else:
                self.save()

    def interrupt(self) -> None:
        self._agent.interrupt()

    # -- slash commands ---------------------------------------------------------------------------

    async def command(self, text: str) -> CommandReply:
        parsed = slash.parse(text)
        if parsed is None:
            return CommandReply(f"not a command: {text}", kind="error")
        if not parsed.known:
            return CommandReply(f"unknown command /{parsed.name} (try /help)", kind="error")
        if self.busy and parsed.name not in ("help", "model", "diff", "sessions", "quit"):
            return CommandReply(
                f"/{parsed.name} must wait for the turn to finish (Esc interrupts it)", "error"
            )
        handler = getattr(self, f"_cmd_{parsed.name}")
        return await handler(parsed.arg)

    async def _cmd_help(self, _arg: str) -> CommandReply:
        return CommandReply("\n".join(slash.help_lines()), kind="help")

    async def _cmd_quit(self, _arg: str) -> CommandReply:
        saved = self.save()
        return CommandReply(f"session {self.session.id} saved" if saved else "", quit=True)

    async def _cmd_clear(self, _arg: str) -> CommandReply:
        saved = self.save()
        old = self.session.id
        self._agent = self._new_agent(None)
        self.undo_stack = UndoStack()
        self.context_tokens = 0
        kept = f" (previous: {old}, still on disk)" if saved else ""
        return CommandReply(f"new session {self.session.id}{kept}", cleared=True)

    async def _cmd_compact(self, _arg: str) -> CommandReply:
        notice = await self._agent.compact()
        self.save()
        self.context_tokens = self._safe_context_tokens()
        return CommandReply(notice.message if notice else "nothing to compact yet")

    async def _cmd_mode(self, arg: str) -> CommandReply:
        if not arg:
            return CommandReply(f"permission mode: {self.mode} (choose from {', '.join(MODES)})")
        try:
            self.policy.mode = _mode(arg)
        except ValueError as e:
            return CommandReply(str(e), kind="error")
        return CommandReply(f"permission mode: {self.mode}")

    async def _cmd_model(self, _arg: str) -> CommandReply:
        b = self.backend
        lines = [f"model: {b.model_name}", f"backend: {b.kind} · {b.label}"]
        lines.append(f"context window: {self.context_window} tokens")
        if b.kind == "demo":
            from mkcode.app.core.backend import DEMO_HINT

            lines.append(DEMO_HINT)
        return CommandReply("\n".join(lines))

    async def _cmd_sessions(self, _arg: str) -> CommandReply:
        sessions = self.store.list(str(self.cwd))
        if not sessions:
            return CommandReply("no saved sessions for this directory", kind="sessions")
        lines = [format_session(s, current=s.id == self.session.id) for s in sessions[:20]]
        return CommandReply("\n".join(lines), kind="sessions", sessions=sessions)

    async def _cmd_resume(self, arg: str) -> CommandReply:
        if not arg:
            latest = next((s for s in self.store.list(str(self.cwd)) if s.id != self.session.id), None)
            if latest is None:
                return CommandReply("no other saved session in this directory", kind="error")
            arg = latest.id
        try:
            session = self.store.load(arg)
        except (KeyError, ValueError) as e:
            return CommandReply(str(e).strip("'\""), kind="error")
        self.save()
        self._agent = self._new_agent(session)
        self.undo_stack = UndoStack()
        self.context_tokens = self._safe_context_tokens()
        return CommandReply(f"resumed session {session.id}", resumed=True)

    async def _cmd_undo(self, _arg: str) -> CommandReply:
        result = self.undo()
        if result is None:
            return CommandReply("nothing to undo in this session", kind="error")
        parts = [f"undid the last turn: {result.messages_removed} messages removed"]
        if result.restored:
            parts.append("restored " + ", ".join(self._rel(p) for p in result.restored))
        if result.removed:
            parts.append("deleted " + ", ".join(self._rel(p) for p in result.removed))
        # The prompt is not put back in the input (the next command would be appended to it):
        # it is named, and ↑ recalls it from the prompt history.
        text = "; ".join(parts) + f"\nits prompt was: {_one_line(result.prompt)} (↑ recalls it)"
        return CommandReply(text, undo=result, resumed=True)

    async def _cmd_diff(self, _arg: str) -> CommandReply:
        diff = session_diff(self.undo_stack.changed_files(), str(self.cwd))
        if not diff:
            return CommandReply("no file changes in this session")
        return CommandReply(diff, kind="diff")

    # -- undo ------------------------------------------------------------------------------------

    def undo(self) -> UndoResult | None:
        """Restore the last turn's files and cut the conversation back to before its prompt."""
        checkpoint = self.undo_stack.pop()
        if checkpoint is None:
            return None
        restored, removed = restore_files(checkpoint)
        messages = self.session.messages
        cut = _last_user_index(messages, expand_mentions(checkpoint.prompt, self.cwd))
        if cut is None:
            cut = min(checkpoint.messages_before, len(messages))
        kept = messages[:cut]
        removed_count = len(messages) - len(kept)
        before = self._safe_context_tokens()
        # A compaction record replaces the history on load, so the rewind survives --resume.
        self.session.record_compaction("", kept, before, 0)
        self.session.record_event("undo", prompt=checkpoint.prompt, restored=restored, removed=removed)
        self.context_tokens = self._safe_context_tokens()
        self.save()
        return UndoResult(checkpoint.prompt, restored, removed, removed_count)

    def _safe_context_tokens(self) -> int:
        try:
            return self._agent.context_tokens()
        except Exception:
            return 0

    def _rel(self, path: str) -> str:
        try:
            return str(Path(path).relative_to(self.cwd))
        except ValueError:
            return path


def _mode(value: str):
    from mkcode.tools import PermissionMode

    return PermissionMode.parse(value)


def _answered(messages: list[dict]) -> bool:
    return any(m.get("role") == "assistant" for m in messages)


def _one_line(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _last_user_index(messages: list[dict], content: str) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and m.get("content") == content:
            return i
    return None


def format_session(info: SessionInfo, *, current: bool = False) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.modified))
    mark = "*" if current else " "
    title = info.title or "(empty)"
    return f"{mark} {info.id}  {when}  {info.messages:>3} msgs  {title}"
