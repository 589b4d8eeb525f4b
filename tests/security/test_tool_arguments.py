"""Hostile tool arguments: every call is checked against its tool's schema, finite numbers only.

Each attack is a call the model (or `mkcode tool --args`) could make; each test asserts the call was
refused with a clear error result (no exception, no trace) and that the command it carried did not run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest

from mkcode.app.cli import main
from mkcode.tools import AuditLog, PermissionMode, SandboxSettings, ToolRegistry, Workspace
from mkcode.tools.arguments import MAX_DEPTH, ArgumentError, parse_arguments, validate_arguments
from mkcode.tools.builtin.run_shell import COMMAND_MAX_CHARS, RunShell
from mkcode.tools.result import ToolResult
from mkcode.tools.sandbox.process import run_captured
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema

MARK = "ran.txt"  # every hostile command below would create this file if it ran
RUN = f"touch {MARK}"


class _Numbers(Tool):
    """A tool with nested numbers: finiteness must hold below the top level too."""

    name = "numbers"
    kind = ToolKind.READ
    description = "test tool"
    parameters: ClassVar[dict[str, Any]] = object_schema(
        {
            "values": {"type": "array", "items": {"type": "number"}},
            "box": {"type": "object", "properties": {"x": {"type": "number"}}},
        },
        [],
    )
    calls: ClassVar[list[dict[str, Any]]] = []

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        _Numbers.calls.append(args)
        return Prepared(preview="numbers", run=lambda: ToolResult.success("ran"))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.fixture
def registry(ws: Path) -> ToolRegistry:
    # Unsandboxed so a command that slipped through would really run and leave MARK behind.
    return ToolRegistry(
        Workspace(ws),
        mode=PermissionMode.FULL_AUTO,
        sandbox=SandboxSettings(dangerously_no_sandbox=True),
        audit=AuditLog(),
        tools=[RunShell(), _Numbers()],
    )


def _refused(registry: ToolRegistry, ws: Path, args: Any, words: str) -> ToolResult:
    r = registry.execute("run_shell", args)
    assert not r.ok and not r.denied, r
    assert (r.error or "").startswith("invalid arguments for run_shell: "), r.error
    assert words in (r.error or ""), r.error
    assert "Traceback" not in (r.error or "")
    assert not (ws / MARK).exists(), "the command ran"
    assert registry.audit.entries[-1].decision == "invalid"
    return r


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literal_timeout_is_refused(registry, ws, literal):
    _refused(registry, ws, f'{{"command": "{RUN}", "timeout": {literal}}}', "not a JSON number")


def test_overflowing_number_is_refused(registry, ws):
    # 1e999 is valid JSON that Python turns into inf: parse_constant never sees it.
    _refused(registry, ws, f'{{"command": "{RUN}", "timeout": 1e999}}', "not a finite number")


def test_nan_in_an_already_parsed_dict_is_refused(registry, ws):
    # The agent loop parses with plain json.loads, which accepts NaN: the registry checks again.
    _refused(registry, ws, {"command": RUN, "timeout": math.nan}, "timeout: nan is not a finite number")


def test_nested_non_finite_numbers_are_refused(registry):
    _Numbers.calls.clear()
    for args in (
        '{"values": [1, 2, NaN]}',
        {"values": [1.0, math.inf]},
        {"box": {"x": -math.inf}},
        '{"box": {"x": 1e400}}',
    ):
        r = registry.execute("numbers", args)
        assert not r.ok, r
        assert "finite number" in (r.error or "") or "not a JSON number" in (r.error or ""), r.error
    assert _Numbers.calls == []  # prepare() never saw them
    assert registry.execute("numbers", {"values": [1, 2.5], "box": {"x": 3}}).ok


def test_timeout_over_the_maximum_is_refused_by_the_schema(registry, ws):
    _refused(registry, ws, {"command": RUN, "timeout": 10**9}, "600")


@pytest.mark.parametrize("timeout", [0, -1, -1e-9])
def test_non_positive_timeout_is_refused(registry, ws, timeout):
    _refused(registry, ws, {"command": RUN, "timeout": timeout}, "timeout")


def test_boolean_and_string_timeouts_are_refused(registry, ws):
    _refused(registry, ws, {"command": RUN, "timeout": True}, "timeout")
    _refused(registry, ws, {"command": RUN, "timeout": "NaN"}, "timeout")


def test_unknown_argument_is_refused(registry, ws):
    _refused(
        registry, ws, {"command": RUN, "dangerously_disable_sandbox": True}, "dangerously_disable_sandbox"
    )


def test_overlong_command_is_refused_without_echoing_it(registry, ws):
    command = RUN + " #" + "x" * COMMAND_MAX_CHARS
    r = _refused(registry, ws, {"command": command}, f"over the {COMMAND_MAX_CHARS}")
    assert len(r.error or "") < 300


def test_deeply_nested_json_is_a_clear_error(registry, ws):
    # json.loads raises RecursionError (not a JSONDecodeError) on this: it must not escape.
    _refused(registry, ws, '{"command": "' + RUN + '", "timeout": ' + "[" * 100_000, "nested")
    deep: list[Any] = []
    inner = deep
    for _ in range(MAX_DEPTH + 5):
        inner.append([])
        inner = inner[0]
    _refused(registry, ws, {"command": RUN, "timeout": deep}, "nested")


def test_huge_integer_literal_is_a_clear_error(registry, ws):
    # int() of more than 4300 digits raises ValueError, not a JSONDecodeError.
    _refused(
        registry, ws, '{"command": "' + RUN + '", "timeout": 1' + "0" * 5000 + "}", "not acceptable JSON"
    )


def test_lone_surrogates_are_refused(registry, ws):
    # json.loads turns "\\ud800" into a str that no path, file or pipe can carry.
    _refused(registry, ws, '{"command": "' + RUN + ' # \\ud800"}', "lone surrogate")
    _refused(registry, ws, {"command": RUN, "\udcff": 1}, "lone surrogate")


def test_audit_log_of_a_hostile_call_is_strict_json(registry, ws, tmp_path):
    log = tmp_path / "audit.jsonl"
    registry.audit = AuditLog(log)
    _refused(registry, ws, {"command": RUN, "timeout": math.nan}, "finite")
    for line in log.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"audit log holds {c}"))


def test_cli_refuses_nan_arguments(capsys, ws):
    rc = main(
        [
            "tool",
            "run_shell",
            "--workspace",
            str(ws),
            "--mode",
            "full-auto",
            "--dangerously-no-sandbox",
            "--args",
            f'{{"command": "{RUN}", "timeout": NaN}}',
        ]
    )
    obj = json.loads(capsys.readouterr().out)
    assert rc == 1 and obj["ok"] is False and "not a JSON number" in obj["error"]
    assert not (ws / MARK).exists()


def test_lower_layers_refuse_nan_too(ws):
    """prepare() and the process runner check again: no caller can hand them an unbounded timeout."""
    ctx = ToolContext(Workspace(ws), SandboxSettings(dangerously_no_sandbox=True))
    r = RunShell().prepare(ctx, {"command": RUN, "timeout": math.nan})
    assert isinstance(r, ToolResult) and not r.ok and "finite" in (r.error or "")
    with pytest.raises(ValueError, match="finite"):
        run_captured(
            ["/bin/sh", "-c", RUN],
            cwd=str(ws),
            env={},
            timeout_s=math.nan,
            output_chars=100,
            flood_bytes=100,
        )
    assert not (ws / MARK).exists()


def test_every_builtin_schema_bounds_every_argument():
    from mkcode.tools.builtin import default_tools

    for tool in default_tools():
        schema = tool.parameters
        assert schema.get("additionalProperties") is False, tool.name
        for name, prop in schema["properties"].items():
            where = f"{tool.name}.{name}"
            if prop["type"] == "string":
                assert isinstance(prop.get("maxLength"), int), where
            if prop["type"] in ("integer", "number"):
                assert "maximum" in prop or "exclusiveMaximum" in prop, where
                assert "minimum" in prop or "exclusiveMinimum" in prop, where
            # The bound is enforced, not only shown: one past it is refused.
            if "maxLength" in prop:
                with pytest.raises(ArgumentError, match=name):
                    validate_arguments(schema, {**_minimal(schema), name: "x" * (prop["maxLength"] + 1)})


def _minimal(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: "a" for k in schema["required"]}


def test_parse_arguments_is_strict_json():
    assert parse_arguments('{"a": 1.5, "b": [1, 2]}') == {"a": 1.5, "b": [1, 2]}
    for text in ('{"a": NaN}', '{"a": [Infinity]}', '{"a": {"b": -Infinity}}', '{"a": -1e999}'):
        with pytest.raises(ArgumentError):
            parse_arguments(text)
