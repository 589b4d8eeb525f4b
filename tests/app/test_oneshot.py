"""`mkcode -p`: text and JSON output, stream-json events, stdin prompts, exit codes, session saved.

Most tests drive `run_oneshot` in process against the scripted engine; two run the real `mkcode`
console script on a tiny synthetic checkpoint through the real engine (slower: a few seconds).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mkcode.app.core.sessions import SessionStore
from mkcode.app.oneshot import EXIT_DENIED, EXIT_ERROR, EXIT_OK, OneShotOptions, read_prompt, run_oneshot
from mkcode.app.settings import Settings
from tests.app.tui.scripted_engine import scripted_backend, text_step, tool_step


def _run(tmp_path: Path, steps, fmt: str = "text", **opts) -> tuple[int, str, str, SessionStore]:
    out, err = io.StringIO(), io.StringIO()
    store = SessionStore(tmp_path / "data")
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    code = run_oneshot(
        Settings(),
        OneShotOptions(prompt=opts.pop("prompt", "do it"), output_format=fmt, **opts),
        cwd=workspace,
        backend=scripted_backend(steps),
        store=store,
        out=out,
        err=err,
    )
    return code, out.getvalue(), err.getvalue(), store


def test_text_output_is_the_final_answer(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("hello\n")
    steps = [tool_step("read_file", {"path": "a.txt"}, text="Reading."), text_step("It says **hello**.")]
    code, out, err, store = _run(tmp_path, steps)
    assert code == EXIT_OK
    assert out == "It says **hello**.\n"  # raw Markdown in a pipe; only the answer on stdout
    assert "read_file a.txt" in err
    [saved] = store.list()
    assert saved.title == "do it"


def test_json_output_is_one_result_object(tmp_path):
    code, out, _, _ = _run(tmp_path, [text_step("All good.")], fmt="json")
    assert code == EXIT_OK
    [line] = out.splitlines()
    result = json.loads(line)
    assert result["type"] == "result" and result["subtype"] == "success"
    assert result["result"] == "All good." and result["exit_code"] == 0
    assert result["usage"]["prompt_tokens"] == 100 and result["model"] == "scripted-model"


def test_stream_json_emits_every_event_then_the_result(tmp_path):
    steps = [tool_step("list_dir", {"path": "."}), text_step("Empty dir.")]
    code, out, _, _ = _run(tmp_path, steps, fmt="stream-json")
    types = [json.loads(line)["type"] for line in out.splitlines()]
    assert code == EXIT_OK
    assert types[0] == "session_started" and types[-1] == "result"
    assert types.index("tool_call_started") < types.index("tool_call_finished") < types.index("turn_finished")
    assert "text_delta" in types


def test_edits_are_denied_by_default_with_exit_code_3(tmp_path):
    steps = [tool_step("write_file", {"path": "new.txt", "content": "x"}), text_step("Could not write.")]
    code, out, _, _ = _run(tmp_path, steps, fmt="json")
    assert code == EXIT_DENIED
    result = json.loads(out)
    assert result["subtype"] == "denied" and result["denied"] == 1
    assert not (tmp_path / "ws" / "new.txt").exists()


def test_allow_edits_lets_the_write_happen(tmp_path):
    steps = [tool_step("write_file", {"path": "new.txt", "content": "x"}), text_step("Wrote it.")]
    code, _, _, _ = _run(tmp_path, steps, allow_edits=True)
    assert code == EXIT_OK
    assert (tmp_path / "ws" / "new.txt").read_text() == "x"


def test_shell_is_denied_unless_allowed(tmp_path):
    steps = [tool_step("run_shell", {"command": "echo hi"}), text_step("ok")]
    code, _, _, _ = _run(tmp_path, steps)
    assert code == EXIT_DENIED


def test_backend_error_exits_1(tmp_path):
    from mkcode.app.agent.client import ModelDone
    from mkcode.app.agent.events import Usage

    code, out, _, _ = _run(tmp_path, [[ModelDone("error", Usage(), "connection refused")]], fmt="json")
    assert code == EXIT_ERROR
    assert json.loads(out)["error"] == "connection refused"


def test_empty_prompt_is_an_error(tmp_path):
    code, _, err, _ = _run(tmp_path, [], prompt="")
    assert code == EXIT_ERROR and "needs a prompt" in err


def test_prompt_from_argument_and_stdin():
    class Pipe(io.StringIO):
        def isatty(self) -> bool:
            return False

    assert read_prompt("explain", Pipe("def f(): pass\n")) == "explain\n\ndef f(): pass"
    assert read_prompt(None, Pipe("just stdin")) == "just stdin"
    assert read_prompt("arg only", Pipe("")) == "arg only"


# -- the real console script, real engine, tiny synthetic checkpoint ---------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from tests.backend.checkpoint.tiny import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)


def _mkcode(args: list[str], tmp_path: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "MKCODE_MAX_TOKENS": "8",
    }
    cmd = [sys.executable, "-m", "mkcode.app.cli", *args]
    return subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )


def test_cli_json_through_the_real_engine(tmp_path, tiny_model):
    r = _mkcode(
        ["-p", "--model", str(tiny_model), "--device", "cpu", "--output-format", "json"], tmp_path, "hi"
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["backend"] == "local" and result["usage"]["completion_tokens"] >= 1
    sessions = list((tmp_path / "data" / "mkcode" / "sessions").glob("*.jsonl"))
    assert len(sessions) == 1


def test_cli_missing_model_dir_exits_1(tmp_path):
    r = _mkcode(["-p", "hi", "--model", str(tmp_path / "nope")], tmp_path)
    assert r.returncode == 1
    assert "not a checkpoint directory" in r.stderr
