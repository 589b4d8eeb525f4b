"""The front-end-neutral layer: import hygiene, demo fallback, crash-safe sessions, undo, status."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mkcode.app.agent import Session
from mkcode.app.core import backend as backend_mod
from mkcode.app.core.sessions import SessionStore
from mkcode.app.core.undo import TurnCheckpoint, restore_files, session_diff
from mkcode.app.settings import Settings
from mkcode.app.tui.widgets.status_bar import Status, render_status


def test_core_and_oneshot_do_not_import_textual_or_torch():
    code = (
        "import sys\n"
        "import mkcode.app.core.conversation, mkcode.app.oneshot, mkcode.app.main_cmd\n"
        "heavy = [m for m in ('torch', 'textual', 'prompt_toolkit') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_no_model_configured_uses_the_demo_model(monkeypatch, tmp_path):
    import mkcode.backend.demo as demo

    stages = []
    monkeypatch.setattr(demo, "ensure_demo_model", lambda progress=None: tmp_path)  # not a checkpoint
    with pytest.raises(backend_mod.BackendError, match="not a checkpoint directory"):
        backend_mod.open_backend(Settings(), lambda stage, _f: stages.append(stage))
    assert Settings().backend == "demo"
    assert any("demo model" in s for s in stages)
    assert "--model DIR" in backend_mod.DEMO_HINT


def test_session_store_survives_a_torn_last_line(tmp_path):
    store = SessionStore(tmp_path)
    s = Session(cwd="/w")
    s.add_message({"role": "user", "content": "hello"})
    path = store.save(s)
    s.add_message({"role": "assistant", "content": "hi"})
    store.save(s)
    with path.open("a") as f:
        f.write('{"type": "message", "mess')  # a crash mid-append
    loaded = store.load(s.id[:6])  # a unique prefix is enough
    assert [m["content"] for m in loaded.messages] == ["hello", "hi"]
    assert path.read_text().endswith("}\n")  # the torn line is gone from the file too
    [info] = store.list("/w")
    assert info.title == "hello" and info.messages == 2


def test_restore_files_and_session_diff(tmp_path):
    existing, created = tmp_path / "a.txt", tmp_path / "new.txt"
    existing.write_text("old\n")
    cp = TurnCheckpoint("p", 0)
    cp.snapshot(str(existing))
    cp.snapshot(str(created))
    existing.write_text("new\n")
    created.write_text("x\n")
    diff = session_diff(cp.files, str(tmp_path))
    assert "-old" in diff and "+new" in diff and "+++ b/new.txt" in diff
    restored, removed = restore_files(cp)
    assert existing.read_text() == "old\n" and not created.exists()
    assert restored == [str(existing)] and removed == [str(created)]


def test_status_bar_fits_80_columns_and_keeps_essentials():
    s = Status(
        model="north-mini-code",
        backend="megakernel · cuda:0",
        mode="auto-edit",
        tokens_per_s=312.4,
        context_used=9000,
        context_window=32768,
        gpu_used_gb=71.2,
        gpu_total_gb=141,
        busy=True,
    )
    wide = render_status(s, 200).plain
    assert "GPU 71.2/141 GB" in wide and "312.4 tok/s" in wide and "ctx 27%" in wide
    narrow = render_status(s, 60).plain
    assert len(narrow) <= 58
    assert "north-mini-code" in narrow and "mode auto-edit" in narrow
