"""`MkcodeApp`: the Textual application. Thin on purpose: it loads the backend behind the start
screen, then hands over to the chat screen, which owns the conversation's UI."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import events, on
from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message

from mkcode.app.agent import Session
from mkcode.app.core.backend import Backend, BackendError, ProgressFn, open_backend
from mkcode.app.core.conversation import Conversation
from mkcode.app.core.prompt_history import PromptHistory
from mkcode.app.core.sessions import SessionStore
from mkcode.app.settings import Settings
from mkcode.app.tui.messages import BackendFailed, BackendReady, LoadProgress
from mkcode.app.tui.screens.chat import ChatScreen
from mkcode.app.tui.screens.sessions import SessionPicker
from mkcode.app.tui.screens.start import StartScreen
from mkcode.app.tui.widgets.prompt import PromptInput

THEMES = {"dark": "textual-dark", "light": "textual-light"}
EXIT_FAILED, EXIT_INTERRUPTED = 1, 130
CLOSE_TIMEOUT_S = 0.5  # the engine thread gets this long to stop when the UI closes
BackendFactory = Callable[[Settings, ProgressFn], Backend]


class MkcodeApp(App[str | None]):
    TITLE = "mkcode"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [Binding("ctrl+t", "toggle_theme", "theme", show=False)]

    def __init__(
        self,
        settings: Settings,
        *,
        cwd: Path,
        store: SessionStore,
        backend: Backend | None = None,
        backend_factory: BackendFactory = open_backend,
        session: Session | None = None,
        pick_session: bool = False,
        history: PromptHistory | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.cwd = cwd
        self.store = store
        self.backend = backend
        self.backend_factory = backend_factory
        self.initial_session = session
        self.pick_session = pick_session
        self.history = history or PromptHistory(None)
        self.conversation: Conversation | None = None
        self.load_error: str | None = None  # why the backend could not start (the launcher prints it)
        self._loader: threading.Thread | None = None
        self.theme = THEMES.get(settings.theme, "textual-dark")

    def on_mount(self) -> None:
        if self.backend is not None:
            self._start_chat(self.backend)
            return
        model = self.settings.endpoint or self.settings.model or "the demo model"
        self.push_screen(StartScreen(str(self.cwd), model))
        self.load_backend()

    def load_backend(self) -> None:
        """Build the backend on a daemon thread of its own, reporting progress by message.

        Not a Textual thread worker: those run on the event loop's executor, which the loop's
        shutdown joins, so quitting during a long load would wait for the load to end. A daemon
        thread lets the app quit at once; `loader_running` tells the launcher it is still going."""
        self._loader = threading.Thread(target=self._load, name="mkcode-load", daemon=True)
        self._loader.start()

    @property
    def loader_running(self) -> bool:
        return self._loader is not None and self._loader.is_alive()

    def _post(self, message: Message) -> bool:
        """Post from the loader thread; False once the app has gone (its loop may be closed)."""
        try:
            return self.is_running and self.post_message(message)
        except RuntimeError:  # the event loop closed between the check and the post
            return False

    def _load(self) -> None:
        try:
            backend = self.backend_factory(
                self.settings, lambda stage, fraction: self._post(LoadProgress(stage, fraction))
            )
        except BackendError as e:
            self._post(BackendFailed(str(e)))
            return
        except Exception as e:  # anything else is still shown, not a traceback over the terminal
            self._post(BackendFailed(f"{type(e).__name__}: {e}"))
            return
        if not self._post(BackendReady(backend)):  # the user quit while it loaded
            backend.close()

    @on(LoadProgress)
    def show_load_progress(self, message: LoadProgress) -> None:
        if isinstance(self.screen, StartScreen):
            self.screen.show_progress(message.stage, message.fraction)

    @on(BackendFailed)
    def show_load_error(self, message: BackendFailed) -> None:
        self.load_error = message.error
        if isinstance(self.screen, StartScreen):
            self.screen.show_error(message.error)

    @on(BackendReady)
    def open_chat(self, message: BackendReady) -> None:
        self.backend = message.backend
        self._start_chat(message.backend)

    def _start_chat(self, backend: Backend) -> None:
        self.conversation = Conversation(
            backend, self.settings, cwd=self.cwd, store=self.store, session=self.initial_session
        )
        chat = ChatScreen(self.conversation, self.history)
        if isinstance(self.screen, StartScreen):
            self.switch_screen(chat)
        else:
            self.push_screen(chat)
        if self.pick_session:
            sessions = self.store.list(str(self.cwd))
            if sessions:
                self.push_screen(SessionPicker(sessions), self._resume_picked)

    async def _resume_picked(self, session_id: str | None) -> None:
        if session_id and isinstance(self.screen, ChatScreen):
            await self.screen.run_command(f"/resume {session_id}")

    async def on_event(self, event: events.Event) -> None:
        """Printable keys for the chat prompt go straight to it: a paste the terminal sends as
        keys (no bracketed paste) is tens of thousands of them, and the general path (binding
        chains of every widget up to the app) cost more than the insert itself. No binding of the
        chat screen or the app is a printable key. Any other key first inserts the typed keys the
        prompt still holds (PromptInput.flush_typed), so a binding that acts on the prompt's text
        (Ctrl+C clears it) sees every key typed before it."""
        if isinstance(event, events.Key) and not event.is_forwarded:
            screen = self.screen
            if isinstance(screen, ChatScreen) and isinstance(screen.focused, PromptInput):
                if event.is_printable and event.character:
                    screen.focused.take_typed(event.character)
                    return
                screen.focused.flush_typed()
        await super().on_event(event)

    def action_quit_interrupted(self) -> None:
        """Ctrl+C / Esc on the way out: the shell's convention for an interrupt is 130."""
        self.exit(return_code=EXIT_INTERRUPTED)

    def action_quit_failed(self) -> None:
        """Leaving after the model could not load: a failure, exit 1."""
        self.exit(self.load_error, return_code=EXIT_FAILED)

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def on_unmount(self) -> None:
        """Interrupt the turn, save, and stop the engine while the event loop still runs (an engine
        callback reaching a closed loop was the `Event loop is closed` error)."""
        if self.conversation is not None:
            self.conversation.interrupt()
            self.conversation.save()
            self.conversation.backend.close(timeout=CLOSE_TIMEOUT_S)
