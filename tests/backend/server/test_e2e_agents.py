"""End to end with the real agents: OpenCode (`opencode run`, Chat Completions through
`@ai-sdk/openai-compatible`) and Codex CLI (`codex exec`, Responses API), offline against the server.

The tiny checkpoint's weights are random, so its decoding is *scripted* (the injected
`ScriptedPipeline` of tests/backend/turn/fakes.py): the script picks the turn (a shell tool call,
then a closing answer) and the engine is forced to emit it token by token, so the engine, the cmd4
parser, the SSE framing and the agent's own client code all run for real. The agents' long system prompts are
cut to their last 64 tokens before prefill (`keep_prompt_tokens`): the output does not depend
on them and a 10k-token CPU prefill would dominate the suite. The tool schemas each agent sent
are then compiled into the tool-call grammar and walked, to show real agent schemas compile.

The agents are installed with npm into a cache directory ($MKCODE_E2E_CACHE, default
~/.cache/mkcode-e2e); the tests skip, saying why, when node/npm are missing or the install fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from mkcode.backend.runtime import RuntimeOptions, build_runtime
from mkcode.backend.server import ServerOptions, create_app
from mkcode.backend.server.client_config import codex_config, opencode_config
from mkcode.backend.server.runner import ServerThread
from mkcode.backend.turn.grammar import ToolSpec, TurnSpec
from tests.backend.checkpoint.tiny import tiny_checkpoint

from ..turn.fakes import install_scripted

MODEL = "tiny-agent"
CACHE = Path(os.environ.get("MKCODE_E2E_CACHE", Path.home() / ".cache" / "mkcode-e2e"))
MARKER = "tool-ok"


def _agent_binary(package: str, binary: str) -> Path:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: the {package} end-to-end test needs node and npm")
    root = CACHE / binary
    path = root / "node_modules" / ".bin" / binary
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        if not (root / "package.json").exists():
            (root / "package.json").write_text(
                json.dumps({"name": f"mkcode-e2e-{binary}", "private": True}) + "\n"
            )
        try:
            proc = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", package],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=400,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm install {package} timed out")
        if proc.returncode != 0 or not path.exists():
            pytest.skip(f"npm install {package} failed: {proc.stderr[-500:]}")
    return path


def _turn(text: str) -> str:
    return f"<|START_THINKING|><|END_THINKING|><|START_TEXT|>{text}<|END_TEXT|>"


def _call(name: str, args: dict) -> str:
    block = json.dumps({"tool_call_id": "0", "tool_name": name, "parameters": args})
    return f"<|START_THINKING|>Run it.<|END_THINKING|><|START_ACTION|>[\n    {block}\n]<|END_ACTION|>"


class Script:
    """The agent's turns: call the shell tool once, then answer with what it printed."""

    def __init__(self, tool: str, args: dict):
        self.tool, self.args = tool, args
        self.requests: list[dict] = []

    def __call__(self, req: dict) -> str:
        self.requests.append(req)
        names = [t["name"] for t in req["tools"]]
        results = [m for m in req["messages"] if m["role"] == "tool"]
        if self.tool not in names:
            return _turn("Marker test")  # title generation and other helper calls
        if not results:
            return _call(self.tool, self.args)
        lines = [line for line in str(results[-1]["content"]).splitlines() if line.strip()]
        return _turn("done: " + (lines[-1].strip()[:40] if lines else ""))  # the command's last line


@pytest.fixture(scope="module")
def agent_runtime(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory.mktemp("ckpt-agent"), seed=0, max_position_embeddings=65536)
    rt = build_runtime(RuntimeOptions(model=path, device="cpu", progress=False, kv_memory_gb=0.1))
    yield rt
    rt.close()


def _serve(rt, script: Script) -> ServerThread:
    app = create_app(rt, options=ServerOptions(served_model_name=MODEL))
    install_scripted(app, script, keep_prompt_tokens=64)
    return ServerThread(app)


def _home_env(tmp: Path) -> dict[str, str]:
    home = tmp / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "OPENCODE", "CODEX"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local/state"),
        MKCODE_API_KEY="sk-local",
    )
    home.mkdir()
    return env


def _run_opencode(
    opencode: Path, tmp: Path, project: Path, config: str, prompt: str, *, timeout: int
) -> subprocess.CompletedProcess[str]:
    """`opencode run --format json PROMPT` in `project`, with `config` (the JSON of
    `opencode_config`) and a fresh home under `tmp`."""
    env = _home_env(tmp)
    env.update(
        OPENCODE_CONFIG_CONTENT=config,
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_SHARE="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        PWD=str(project),  # OpenCode takes its working directory from $PWD, not the real cwd
    )
    return subprocess.run(
        [str(opencode), "run", "--format", "json", prompt],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _run_codex(
    codex: Path,
    tmp: Path,
    work: Path,
    config: str,
    prompt: str,
    *,
    timeout: int,
    json_events: bool = False,
    env_extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`codex exec [--json] --skip-git-repo-check -s danger-full-access -C WORK PROMPT`, with
    `config` (the TOML of `codex_config`) as its config.toml in a fresh home under `tmp`."""
    env = _home_env(tmp)
    codex_home = Path(env["HOME"]) / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(config)
    env["CODEX_HOME"] = str(codex_home)
    env.update(env_extra or {})
    flags = ["--json"] if json_events else []
    return subprocess.run(
        [
            str(codex),
            "exec",
            *flags,
            "--skip-git-repo-check",
            "-s",
            "danger-full-access",
            "-C",
            str(work),
            prompt,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _events(stdout: str) -> list[dict]:
    """The JSON events a client printed, one a line."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _grammar_walk(rt, tools: list[dict]) -> None:
    """Compile the agent's real tool schemas into the auto-mode grammar and take a few steps."""
    grammars = create_app(rt).state.mkcode.grammars
    spec = TurnSpec(tuple(ToolSpec(t["name"], t.get("parameters") or {}) for t in tools), "auto")
    c = grammars.for_turn(spec, lenient_tools=True)
    for _ in range(5):
        mask = c.allowed_tokens(grammars.vocab_size)
        assert bool(mask.any())
        c.advance(int(torch.nonzero(mask)[0]))


def test_opencode_run_calls_a_tool(agent_runtime, tmp_path):
    opencode = _agent_binary("opencode-ai", "opencode")
    project = tmp_path / "project"
    project.mkdir()
    script = Script(
        "bash", {"command": f"echo {MARKER} > marker.txt && cat marker.txt", "description": "marker"}
    )
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    with _serve(agent_runtime, script) as srv:
        config = opencode_config(srv.base_url + "/v1", MODEL, context=65536, output=512)
        proc = _run_opencode(opencode, tmp_path, project, json.dumps(config), "TOOLTEST", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = _events(proc.stdout)
    # OpenCode's bash tool may run with a private /tmp (where pytest's tmp_path lives), so the
    # proof that the call ran is its reported output, echoed back by the scripted final turn.
    tools = [e["part"] for e in events if e.get("type") == "tool_use"]
    assert tools and tools[0]["tool"] == "bash", proc.stdout[-2000:]
    assert tools[0]["state"]["status"] == "completed" and MARKER in tools[0]["state"]["output"]
    finishes = [e["part"]["reason"] for e in events if e.get("type") == "step_finish"]
    assert finishes == ["tool-calls", "stop"]
    assert f"done: {MARKER}" in proc.stdout
    main = [r for r in script.requests if any(t["name"] == "bash" for t in r["tools"])]
    assert len(main) >= 2  # the tool call turn and the turn after the tool ran
    _grammar_walk(agent_runtime, main[0]["tools"])


def test_codex_exec_calls_a_tool(agent_runtime, tmp_path):
    codex = _agent_binary("@openai/codex", "codex")
    work = tmp_path / "work"
    work.mkdir()
    script = Script(
        "exec_command", {"cmd": f"echo {MARKER} > {work / 'marker.txt'} && cat {work / 'marker.txt'}"}
    )
    with _serve(agent_runtime, script) as srv:
        config = codex_config(srv.base_url + "/v1", MODEL)
        proc = _run_codex(codex, tmp_path, work, config, "TOOLTEST", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"done: {MARKER}" in proc.stdout, proc.stdout[-2000:]
    _grammar_walk(agent_runtime, script.requests[0]["tools"])
