"""The sandboxed command's environment: an allow list of names, then a credential check of every value.

The attacks: the model runs `env` (or reads /proc/self/environ) and copies what it finds; or the host
environment carries a variable that makes a host-side launcher run a workspace file (BASH_ENV).
Each test fails if the allow list or the value check is removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mkcode.tools import PermissionMode, SandboxSettings, ToolRegistry, Workspace
from mkcode.tools.sandbox.env import (
    NEVER_PASSED,
    check_allow_list,
    filter_environment,
    is_secret_value,
)
from mkcode.tools.sandbox.runner import ShellOutcome, run_shell_command, sandbox_status

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjaS1qb2IiLCJwcm9qZWN0IjoibWtjb2RlIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYZEXAMPLEKEY"
SLACK = "https://hooks.slack.com/services/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"
SENTRY = "https://3f2b1c9d8e7a6b5c4d3e2f1a0b9c8d7e@o450123.ingest.sentry.io/5501234"
HEX = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
B64 = "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWo"

# The variables issue 40 found passing a name-based deny list, and more of the same class.
ISSUE_VARIABLES = {
    "MYSQL_PWD": "hunter2-but-longer",
    "GITHUB_PAT": "github_pat_11AAAAAAA0Zx8Yw7Vu6Ts5_Rq4Po3Nm2Lk1Jh0Gf9Ed8Cb7Aa6",
    "CI_JOB_JWT": JWT,
    "SENTRY_DSN": SENTRY,
    "SLACK_WEBHOOK_URL": SLACK,
    "PGPASSFILE": "/root/.pgpass",
    "VAULT_ADDR": "https://vault.internal:8200",
    "DOCKER_HOST": "unix:///var/run/docker.sock",
    "SSH_AUTH_SOCK": "/run/user/0/ssh-agent",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus",
    "HTTPS_PROXY": "http://proxy.internal:3128",
    "npm_config__authToken": "npmtok-Q7x2",
    "MKCODE_API_KEY": "mk-local-key-Q7",
}
ORDINARY = {
    "PATH": "/nix/store/0c6jsd1m6ijn5k3ql2v1m6qq1fj3ilrx-python3-3.11.4/bin:/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/dev",
    "LANG": "en_US.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "xterm-256color",
    "VIRTUAL_ENV": "/home/dev/project/.venv",
    "CUDA_VISIBLE_DEVICES": "GPU-3f2b1c9d-8e7a-4b5c-9d3e-2f1a0b9c8d7e",
    "CFLAGS": "-O2 -g -march=native",
    "GOPATH": "/home/dev/go",
    "TZ": "Europe/Berlin",
}


def test_ordinary_variables_pass_unchanged():
    result = filter_environment(ORDINARY)
    assert result.env == ORDINARY
    assert result.removed == ()


@pytest.mark.parametrize("name", sorted(ISSUE_VARIABLES))
def test_issue_variables_do_not_pass(name):
    result = filter_environment({**ORDINARY, name: ISSUE_VARIABLES[name]})
    assert name not in result.env and name in result.removed
    assert result.env == ORDINARY


@pytest.mark.parametrize(
    "value",
    [JWT, AWS_SECRET, SLACK, SENTRY, HEX, B64, "ghp_Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9Ed8Cb"],
    ids=["jwt", "aws-secret", "slack-webhook", "sentry-dsn", "hex-64", "base64-43", "ghp"],
)
def test_allowed_names_with_secret_values_are_dropped(value):
    # An allowed name is no door for a credential: the value is checked too, and only the name reported.
    env = {**ORDINARY, "VIRTUAL_ENV": value, "TERM": value, "LC_PAPER": value, "GOPROXY": value}
    result = filter_environment(env)
    assert set(result.secret_values) == {"VIRTUAL_ENV", "TERM", "LC_PAPER", "GOPROXY"}
    assert value not in json.dumps(result.env) and value not in repr(result.removed)


@pytest.mark.parametrize(
    "value",
    [
        "postgres://app:pa55word@db.internal/app",
        "https://:npm_secret@registry.internal/",
        "https://storage.example.com/b/o?X-Amz-Signature=abcdef0123456789&X-Amz-Date=1",
        "https://api.example.com/v1?access_token=abc123def456",
        "https://discord.com/api/webhooks/123456/abcdef",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA\n-----END OPENSSH PRIVATE KEY-----",
        "Bearer abcdefghijklmnop0123",
        "--token=sk-proj-Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1",
    ],
)
def test_credential_shapes_inside_values(value):
    assert is_secret_value(value)
    assert filter_environment({"PYTHONPATH": value}).secret_values == ("PYTHONPATH",)


def test_random_names_with_secret_values_do_not_pass():
    env = {"BUILD_LABEL": JWT, "X": AWS_SECRET, "FOO_URL": SENTRY, "NOTIFY": SLACK, "SEED": HEX}
    result = filter_environment(env)
    assert result.env == {} and set(result.removed) == set(env)


def test_user_allowed_names_pass_but_their_secret_values_do_not():
    env = {"MYAPP_MODE": "dev", "MYAPP_KEYFILE": "/etc/myapp/key.pem", "OTHER_TOOL_HOME": "/opt/tool"}
    env["MYAPP_TOKEN"] = "ghp_Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9Ed8Cb"
    result = filter_environment(env, allow=("MYAPP_*", "OTHER_TOOL_HOME"))
    assert result.env == {
        "MYAPP_MODE": "dev",
        "MYAPP_KEYFILE": "/etc/myapp/key.pem",
        "OTHER_TOOL_HOME": "/opt/tool",
    }
    assert result.secret_values == ("MYAPP_TOKEN",)
    assert filter_environment(env).env == {}  # nothing of it without the user's list


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "BASH_FUNC_ls%%"])
def test_launcher_variables_never_pass_even_when_listed(name):
    result = filter_environment({name: "/ws/evil.so"}, allow=(name, "LD_*", "BASH_*"))
    assert result.env == {}
    assert check_allow_list([name]) or name.startswith("BASH_FUNC_")
    assert "LD_PRELOAD" in NEVER_PASSED and "BASH_ENV" in NEVER_PASSED


def test_bad_allow_list_entries_are_reported():
    problems = check_allow_list(["GOOD_NAME", "PREFIX_*", "*", "has space", "LD_PRELOAD"])
    assert len(problems) == 3 and not any("GOOD_NAME" in p or "PREFIX_" in p for p in problems)


# -- end to end: what a command in the sandbox sees -------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def _sandboxed_env(
    ws: Path, environ: dict[str, str], allow: tuple[str, ...] = ()
) -> tuple[str, ShellOutcome]:
    settings = SandboxSettings(env_allow=allow)
    if not sandbox_status(settings, [str(ws)]).available:
        pytest.skip("bubblewrap is not usable here")
    outcome = run_shell_command(
        "cat /proc/self/environ | tr '\\0' '\\n'; echo; env",
        roots=[str(ws)],
        cwd=str(ws),
        timeout_s=20,
        settings=settings,
        sandboxed=True,
        environ=environ,
    )
    assert outcome.process.exit_code == 0, outcome.process.output
    return outcome.process.output, outcome


def test_sandboxed_command_sees_only_allowed_variables(ws):
    environ = {**ORDINARY, **ISSUE_VARIABLES, "VIRTUAL_ENV": JWT}
    output, outcome = _sandboxed_env(ws, environ)
    for name, value in ISSUE_VARIABLES.items():
        assert f"{name}=" not in output and value not in output, name
    assert JWT not in output
    for name in ("PATH", "HOME", "LANG", "TERM", "LC_ALL"):
        assert f"{name}={ORDINARY[name]}" in output, name
    assert outcome.env_secret_values == ("VIRTUAL_ENV",)
    assert set(ISSUE_VARIABLES) <= set(outcome.env_removed)


def test_bash_env_from_the_host_is_not_run(ws):
    # BASH_ENV is read by every non-interactive bash before its command: a planted script would run.
    hook = ws / "hook.sh"
    hook.write_text(f"echo pwned > {ws}/pwned\n")
    _, outcome = _sandboxed_env(
        ws, {**ORDINARY, "BASH_ENV": str(hook), "ENV": str(hook)}, allow=("BASH_ENV", "ENV")
    )
    assert not (ws / "pwned").exists()
    assert any("BASH_ENV is never passed" in n for n in outcome.notes)  # the user learns why


def test_tool_result_names_the_dropped_variable_never_its_value(ws, monkeypatch):
    if not sandbox_status(SandboxSettings(), [str(ws)]).available:
        pytest.skip("bubblewrap is not usable here")
    for name in list(__import__("os").environ):
        monkeypatch.delenv(name)
    for name, value in {**ORDINARY, "VIRTUAL_ENV": SENTRY, "CI_JOB_JWT": JWT}.items():
        monkeypatch.setenv(name, value)
    reg = ToolRegistry(Workspace(ws), mode=PermissionMode.FULL_AUTO)
    r = reg.execute("run_shell", {"command": "env"})
    assert r.ok, r
    text = json.dumps(r.to_dict()) + r.for_model()
    assert SENTRY not in text and JWT not in text
    assert "VIRTUAL_ENV" in r.output and "credential" in r.output
    assert r.meta["env_secret_values"] == ["VIRTUAL_ENV"]
