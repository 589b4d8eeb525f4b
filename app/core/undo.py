"""`/undo`: put back the files the last turn changed, and the conversation as it was before it.

`SnapshottingRegistry` is the tools' `ToolRegistry` with one addition: before an `edit_file` or
`write_file` call runs, it copies the target file's current bytes (or notes that it did not exist)
into the open `TurnCheckpoint`. Only the first snapshot of a path per turn is kept, so undo restores
the state from before the turn. Shell commands are not tracked (their effects are unknowable).
"""

from __future__ import annotations

import difflib
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from mkcode.tools import ToolRegistry, fdwalk
from mkcode.tools.safe_io import atomic_write, read_bytes
from mkcode.tools.workspace import Access, PathError, Workspace

FILE_TOOLS = ("edit_file", "write_file")


@dataclass
class TurnCheckpoint:
    """What one user turn may change: the history length before it and the files' old bytes."""

    prompt: str
    messages_before: int
    files: dict[str, bytes | None] = field(default_factory=dict)  # abs path -> old bytes (None: absent)
    # Set by SnapshottingRegistry: snapshots and restores then go through the workspace's checks
    # and directory descriptors, so a directory swapped for a symlink cannot redirect them.
    workspace: Workspace | None = None

    def snapshot(self, path: str) -> None:
        if path in self.files:
            return
        if self.workspace is not None:
            try:
                rp = self.workspace.resolve(path, Access.WRITE)
                self.files[path] = read_bytes(self.workspace, rp) if rp.exists else None
            except PathError:
                pass  # the tool refuses it too
            return
        try:
            with open(path, "rb") as f:
                self.files[path] = f.read()
        except FileNotFoundError:
            self.files[path] = None


@dataclass(frozen=True)
class UndoResult:
    prompt: str  # the undone turn's prompt (front ends put it back in the input box)
    restored: list[str]  # paths written back
    removed: list[str]  # paths the turn created, deleted again
    messages_removed: int


class SnapshottingRegistry(ToolRegistry):
    """A ToolRegistry that snapshots files into `checkpoint` before file tools change them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checkpoint: TurnCheckpoint | None = None
        self._snap_lock = threading.Lock()

    def execute(self, name: str, args: dict[str, Any] | str | None = None):  # type: ignore[override]
        checkpoint = self.checkpoint
        if checkpoint is not None and name in FILE_TOOLS and isinstance(args, dict):
            path = args.get("path")
            if isinstance(path, str):
                try:
                    resolved = self.workspace.resolve(path, Access.WRITE).path
                except PathError:
                    resolved = None  # the tool will refuse it too
                if resolved is not None:
                    with self._snap_lock:
                        checkpoint.workspace = self.workspace
                        checkpoint.snapshot(resolved)
        return super().execute(name, args)


class UndoStack:
    """Checkpoints of the turns of one session, newest last."""

    def __init__(self) -> None:
        self.turns: list[TurnCheckpoint] = []

    def begin(self, prompt: str, messages_before: int) -> TurnCheckpoint:
        checkpoint = TurnCheckpoint(prompt, messages_before)
        self.turns.append(checkpoint)
        return checkpoint

    def pop(self) -> TurnCheckpoint | None:
        return self.turns.pop() if self.turns else None

    def changed_files(self) -> dict[str, bytes | None]:
        """Every file changed in this session, with its content from before the first change."""
        first: dict[str, bytes | None] = {}
        for turn in self.turns:
            for path, data in turn.files.items():
                first.setdefault(path, data)
        return first


def restore_files(checkpoint: TurnCheckpoint) -> tuple[list[str], list[str]]:
    """Write the snapshots back; returns (restored, removed) paths."""
    restored, removed = [], []
    ws = checkpoint.workspace
    for path, data in checkpoint.files.items():
        if ws is not None:
            try:
                done = _restore_confined(ws, path, data)
            except PathError:
                continue  # now outside the workspace or protected: left alone
            (restored if data is not None else removed).extend([path] if done else [])
            continue
        if data is None:
            if os.path.exists(path):
                os.unlink(path)
                removed.append(path)
            continue
        current = _read(path)
        if current != data:
            tmp = f"{path}.mkcode-undo"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            restored.append(path)
    return restored, removed


def _restore_confined(ws: Workspace, path: str, data: bytes | None) -> bool:
    rp = ws.resolve(path, Access.WRITE)
    if data is None:
        if not rp.exists:
            return False
        with fdwalk.open_parent(ws, rp.path) as (dfd, name):
            os.unlink(name, dir_fd=dfd)
        return True
    if rp.exists and read_bytes(ws, rp) == data:
        return False
    atomic_write(ws, rp, data)
    return True


def session_diff(changed: dict[str, bytes | None], root: str) -> str:
    """A unified diff from each file's original content to what is on disk now."""
    parts = []
    for path in sorted(changed):
        old, new = changed[path], _read(path)
        if old == new:
            continue
        rel = os.path.relpath(path, root)
        old_lines = (old or b"").decode("utf-8", "replace").splitlines(keepends=True)
        new_lines = (new or b"").decode("utf-8", "replace").splitlines(keepends=True)
        a = "/dev/null" if old is None else f"a/{rel}"
        b = "/dev/null" if new is None else f"b/{rel}"
        parts.append("".join(difflib.unified_diff(old_lines, new_lines, a, b)))
    return "".join(parts)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
