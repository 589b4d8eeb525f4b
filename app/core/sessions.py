"""Sessions on disk: one JSONL file per session under `$XDG_DATA_HOME/mkcode/sessions/`.

The records are the agent's `Session` records. Writes are crash-safe: the first write goes to a
temporary file renamed into place, and later writes append all new records in one `write()` on an
`O_APPEND` descriptor, so a crash leaves at most a torn last line, which loading skips.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mkcode.app.agent.session import Session


@dataclass(frozen=True)
class SessionInfo:
    """One line of the `/sessions` list."""

    id: str
    path: Path
    created: float
    modified: float
    cwd: str
    model: str
    title: str  # the first user prompt, shortened
    messages: int


class SessionStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._written: dict[str, int] = {}  # session id -> records already on disk

    @property
    def sessions_dir(self) -> Path:
        return self.root / "sessions"

    def path_for(self, session_id: str) -> Path:
        return self.sessions_dir / f"{session_id}.jsonl"

    # -- writing ---------------------------------------------------------------------------------

    def save(self, session: Session) -> Path:
        """Write what is new since the last save (the whole file the first time)."""
        path = self.path_for(session.id)
        written = self._written.get(session.id)
        if written is None or not path.exists():
            self._write_whole(session, path)
        elif written < len(session.records):
            lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in session.records[written:])
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, lines.encode("utf-8"))
            finally:
                os.close(fd)
        self._written[session.id] = len(session.records)
        return path

    def discard(self, session_id: str) -> None:
        """Remove a session's file (a run that failed before it was worth keeping)."""
        self.path_for(session_id).unlink(missing_ok=True)
        self._written.pop(session_id, None)

    def _write_whole(self, session: Session, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(session.to_jsonl())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # -- reading ---------------------------------------------------------------------------------

    def load(self, session_id: str) -> Session:
        """The session with this id (or unique id prefix); KeyError when there is none."""
        path = self._find(session_id)
        lines = path.read_text(encoding="utf-8").splitlines()
        torn = False
        if lines:
            try:
                json.loads(lines[-1])
            except ValueError:  # a torn last line from a crash mid-append
                lines, torn = lines[:-1], True
        session = Session.from_jsonl("\n".join(lines))
        if torn:  # rewrite without it, so later appends do not follow a broken line
            self._write_whole(session, path)
        self._written[session.id] = len(session.records)
        return session

    def _find(self, session_id: str) -> Path:
        exact = self.path_for(session_id)
        if exact.exists():
            return exact
        matches = sorted(self.sessions_dir.glob(f"{session_id}*.jsonl")) if session_id else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise KeyError(f"no session {session_id!r} in {self.sessions_dir}")
        raise KeyError(f"session id {session_id!r} is ambiguous ({len(matches)} match)")

    def list(self, cwd: str | None = None) -> list[SessionInfo]:
        """Sessions, newest first; only those started in `cwd` when given."""
        out = []
        for path in self.sessions_dir.glob("*.jsonl"):
            info = _info(path)
            if info is not None and (cwd is None or info.cwd == cwd):
                out.append(info)
        return sorted(out, key=lambda i: i.modified, reverse=True)

    def latest(self, cwd: str | None = None) -> SessionInfo | None:
        sessions = self.list(cwd)
        return sessions[0] if sessions else None


def _info(path: Path) -> SessionInfo | None:
    """Read a session's header and first prompt without building the whole Session."""
    try:
        with path.open(encoding="utf-8") as f:
            head = json.loads(f.readline())
            title, messages = "", 0
            for line in f:
                if '"type": "message"' not in line or not line.rstrip().endswith("}"):
                    continue
                messages += 1
                if not title:
                    try:
                        msg = json.loads(line)["message"]
                    except (ValueError, KeyError):
                        continue
                    if msg.get("role") == "user":
                        title = " ".join(str(msg.get("content", "")).split())[:72]
        modified = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    if head.get("type") != "session":
        return None
    return SessionInfo(
        id=head["id"],
        path=path,
        created=head.get("created", 0.0),
        modified=modified,
        cwd=head.get("cwd", ""),
        model=head.get("model", ""),
        title=title,
        messages=messages,
    )


def initial_session(store: SessionStore, cwd: Path, continue_: bool, resume: str | None, *, picker: bool):
    """The session `--continue` / `--resume ID` ask for, or None for a new one.

    `--resume` without an ID returns None when `picker` (the front end shows a list); otherwise it
    is an error. Raises KeyError with a message when the session cannot be found."""
    if resume:
        return store.load(resume)
    if resume == "" and not picker:
        raise KeyError("--resume needs a session ID here; list them with /sessions in mkcode")
    if continue_:
        latest = store.latest(str(cwd))
        if latest is None:
            raise KeyError(f"no saved session to continue in {cwd}")
        return store.load(latest.id)
    return None
