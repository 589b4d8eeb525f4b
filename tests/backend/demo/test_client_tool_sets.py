"""The OpenCode- and Codex-shaped tool sets of the demo model's training data (backend/demo/
vocabularies.py) against what the installed clients really send: `opencode run` and `codex exec`
talk to a scripted `mkcode serve` (the scripted decode of tests/backend/server/test_e2e_agents.py:
the tiny random checkpoint is forced to emit a fixed series of tool calls), and the test compares

- the tool names, argument names, types, enums and required lists each client sent with the set's
  schemas (descriptions aside: the set's are mkcode's own words);
- every tool result the client sent back with what the evaluation's executor returns for the same
  call on a copy of the project (`vocabularies.execute`, whose formats the training data uses),
  Codex's chunk id and wall time aside;
- Codex's environment message, an `<environment_context>` user message with the working directory.

Skipped, saying why, when node/npm or the clients are missing (`_agent_binary` installs them into
$MKCODE_E2E_CACHE when it can).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mkcode.backend.demo import vocabularies as vocab
from mkcode.backend.runtime import RuntimeOptions, build_runtime
from mkcode.backend.server.client_config import codex_config, opencode_config
from tests.backend.checkpoint.tiny import tiny_checkpoint
from tests.backend.server.test_e2e_agents import (
    MODEL,
    _agent_binary,
    _call,
    _run_codex,
    _run_opencode,
    _serve,
    _turn,
)

pytestmark = pytest.mark.slow

FILES = {
    "app.py": "def build():\n    return 1\n\n\ndef run(x):\n    return x\n",
    "notes.md": "# notes\n",
    "src/util.py": "def helper(a, b):\n    return a + b\n",
}


class Calls:
    """Scripted turns: the given calls one by one (each after the previous result), then an answer."""

    def __init__(self, marker: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.marker, self.calls = marker, calls
        self.requests: list[dict[str, Any]] = []

    def __call__(self, req: dict[str, Any]) -> str:
        self.requests.append(json.loads(json.dumps(req, default=str)))
        if self.marker not in [t["name"] for t in req["tools"]]:
            return _turn("Title")  # the client's helper requests (titles)
        done = sum(m["role"] == "tool" for m in req["messages"])
        return _call(*self.calls[done]) if done < len(self.calls) else _turn("done")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory.mktemp("ckpt-tools"), seed=0, max_position_embeddings=65536)
    rt = build_runtime(RuntimeOptions(model=path, device="cpu", progress=False, kv_memory_gb=0.1))
    yield rt
    rt.close()


def _project(root: Path) -> Path:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _shape(schema: Any) -> Any:
    """A schema without its description texts (a property named "description" stays)."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def _check_schemas(sent: list[dict[str, Any]], ts: vocab.ToolSet) -> None:
    ours = {t["function"]["name"]: _shape(t["function"]["parameters"]) for t in ts.tools}
    theirs = {t["name"]: _shape(t.get("parameters")) for t in sent}
    assert list(theirs) == list(ours), "the client's tool names changed"
    for name in ours:
        assert theirs[name] == ours[name], (name, json.dumps(theirs[name]))


def _results(req: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(tool, arguments, result) of every call in a request's history."""
    calls = {
        c["id"]: (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for m in req["messages"]
        for c in m.get("tool_calls") or []
    }
    return [(*calls[m["tool_call_id"]], m["content"]) for m in req["messages"] if m["role"] == "tool"]


def _expected(ts: vocab.ToolSet, root: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    from mkcode.tools import ToolRegistry, Workspace

    registry = ToolRegistry(Workspace(str(root)), mode="full-auto")
    rng = random.Random(0)
    out = []
    for name, args in calls:
        text = vocab.execute(ts, registry, name, json.dumps(args), root, rng)
        out.append(text.replace(" [ran outside the sandbox]", ""))
    return out


def test_opencode_sends_the_opencode_shaped_tool_set(runtime, tmp_path: Path) -> None:
    opencode = _agent_binary("opencode-ai", "opencode")
    project = _project(tmp_path / "project")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    calls = [
        ("read", {"filePath": str(project / "app.py")}),
        ("read", {"filePath": "src"}),
        ("grep", {"pattern": "def (build|run)"}),
        ("glob", {"pattern": "src/*.py"}),
        ("edit", {"filePath": str(project / "app.py"), "oldString": "def build(", "newString": "def make("}),
        ("bash", {"command": "ls src"}),
        ("bash", {"command": "true"}),
    ]
    script = Calls("bash", calls)
    with _serve(runtime, script) as srv:
        config = json.dumps(opencode_config(srv.base_url + "/v1", MODEL, context=65536, output=512))
        proc = _run_opencode(opencode, tmp_path, project, config, "TOOLTEST", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    main = [r for r in script.requests if any(t["name"] == "bash" for t in r["tools"])]
    ts = vocab.opencode_set()
    _check_schemas(main[0]["tools"], ts)
    got = _results(main[-1])
    assert [(n, a) for n, a, _ in got] == calls
    copy = _project(tmp_path / "copy")
    want = _expected(ts, copy, json.loads(json.dumps(calls).replace(str(project), str(copy))))
    for (name, args, result), expected in zip(got, want, strict=True):
        assert result == expected.replace(str(copy), str(project)), (name, args)


def test_codex_sends_the_codex_shaped_tool_set(runtime, tmp_path: Path) -> None:
    codex = _agent_binary("@openai/codex", "codex")
    project = _project(tmp_path / "project")
    calls = [
        ("exec_command", {"cmd": "ls -AF"}),
        ("exec_command", {"cmd": "cat -n app.py"}),
        ("exec_command", {"cmd": "grep -rn 'def build' ."}),
        ("exec_command", {"cmd": "find . -name '*.py' | sort"}),
        ("exec_command", {"cmd": "sed -i 's/def build(/def make(/' app.py"}),
        ("exec_command", {"cmd": "grep -rn 'def build' ."}),
    ]
    script = Calls("exec_command", calls)
    with _serve(runtime, script) as srv:
        config = codex_config(srv.base_url + "/v1", MODEL)
        proc = _run_codex(
            codex,
            tmp_path,
            project,
            config,
            "TOOLTEST",
            timeout=240,
            json_events=True,
            env_extra={"LC_ALL": "C"},
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ts = vocab.codex_set()
    _check_schemas(script.requests[0]["tools"], ts)
    last = script.requests[-1]
    assert last["messages"][0]["role"] == "system"
    context = next(m["content"] for m in last["messages"] if m["role"] == "user")
    assert context.startswith("<environment_context>") and f"<cwd>{project}</cwd>" in context
    assert "<shell>bash</shell>" in context and "<current_date>" in context
    got = _results(last)
    assert [(n, a) for n, a, _ in got] == calls
    wrapper = re.compile(r"^Chunk ID: [0-9a-f]{6}\nWall time: [\d.]+ seconds\n")
    want = _expected(ts, _project(tmp_path / "copy"), calls)
    for (name, args, result), expected in zip(got, want, strict=True):
        assert wrapper.match(result), result
        assert wrapper.sub("", result) == wrapper.sub("", expected), (name, args)
