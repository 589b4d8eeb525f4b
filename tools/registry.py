"""ToolRegistry: the one entry point the agent loop uses.

execute(name, args) validates the arguments against the tool's JSON schema, lets the tool plan the
call (an edit computes its diff), asks the permission policy, asks the user through the approver
callback when needed, runs the call, and records everything in the audit log. It never raises:
every failure is a ToolResult the model can read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from mkcode.tools.arguments import ArgumentError, validate_arguments
from mkcode.tools.builtin import default_tools
from mkcode.tools.permissions.approval import ApprovalRequest, ApprovalResponse, Approver, Decision
from mkcode.tools.permissions.audit import AuditEntry, AuditLog, loggable_args
from mkcode.tools.permissions.modes import PermissionMode
from mkcode.tools.permissions.policy import PermissionPolicy
from mkcode.tools.permissions.rules import suggest_rule
from mkcode.tools.result import ToolResult
from mkcode.tools.sandbox.runner import SandboxSettings
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolSpec
from mkcode.tools.workspace import Workspace


def _loggable(args: Any) -> dict[str, Any]:
    """The arguments as the audit log keeps them; hostile ones (NaN, deep nesting) as a note."""
    try:
        logged = loggable_args(args)
        json.dumps(logged, allow_nan=False)
        return logged
    except (ValueError, TypeError, RecursionError):
        return {"_raw": f"<arguments that are not plain JSON: {type(args).__name__}>"}


class ToolRegistry:
    def __init__(
        self,
        workspace: Workspace,
        *,
        policy: PermissionPolicy | None = None,
        mode: PermissionMode | str = PermissionMode.ASK,
        approver: Approver | None = None,
        sandbox: SandboxSettings | None = None,
        audit: AuditLog | None = None,
        tools: Sequence[Tool] | None = None,
    ) -> None:
        self.workspace = workspace
        self.policy = policy if policy is not None else PermissionPolicy(PermissionMode.parse(mode))
        self.approver = approver  # None: non-interactive, anything that would ask is denied
        self.context = ToolContext(workspace, sandbox or SandboxSettings())
        self.audit = audit if audit is not None else AuditLog()
        self._tools: dict[str, Tool] = {t.name: t for t in (tools if tools is not None else default_tools())}

    # -- what the model sees ------------------------------------------------------------------

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self._tools.values()]

    def openai_tools(self) -> list[dict[str, Any]]:
        return [s.to_openai() for s in self.specs()]

    def names(self) -> list[str]:
        return list(self._tools)

    # -- running a call -----------------------------------------------------------------------

    def execute(self, name: str, args: dict[str, Any] | str | None = None) -> ToolResult:
        started = time.time()
        t0 = time.monotonic()
        log = {"time": started, "tool": str(name), "args": _loggable(args)}
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools)
            return self._invalid(log, None, f"unknown tool {name!r}; available tools: {known}")
        parsed, problem = self._parse_args(name, tool, args)
        if parsed is None:
            return self._invalid(log, tool.kind.value, problem)
        log["args"] = loggable_args(parsed)
        try:
            return self._execute(tool, parsed, log, t0)
        except Exception as e:  # a bug in a tool must not kill the agent loop
            result = ToolResult.failure(f"internal error in {name}: {type(e).__name__}: {e}")
            self._record(log, tool.kind.value, "allowed", "error", result, t0)
            return result

    def _parse_args(self, name: str, tool: Tool, args: Any) -> tuple[dict[str, Any] | None, str]:
        try:
            return validate_arguments(tool.parameters, args), ""
        except ArgumentError as e:
            return None, f"invalid arguments for {name}: {e}"

    def _execute(self, tool: Tool, args: dict[str, Any], log: dict[str, Any], t0: float) -> ToolResult:
        kind = tool.kind.value
        planned = tool.prepare(self.context, args)
        if isinstance(planned, ToolResult):  # failed while planning (bad path, no match...)
            self._record(log, kind, "allowed", "policy", planned, t0)
            return planned
        unsandboxed = planned.unsandboxed_reason is not None
        verdict = self.policy.check(tool.name, tool.kind, args, unsandboxed=unsandboxed)
        if verdict.allowed:
            decided_by = verdict.by
            if planned.meta.get("sandboxed") is False:
                decided_by = "setting:dangerously_no_sandbox"
            return self._run(planned, log, kind, decided_by, t0)
        reason = verdict.by if not unsandboxed else f"{verdict.by}: {planned.unsandboxed_reason}"
        if self.approver is None:
            hint = (
                "bubblewrap is unavailable; fix the sandbox, or allow unsandboxed commands explicitly "
                "with --dangerously-no-sandbox"
                if unsandboxed
                else "a non-interactive run denies anything that needs approval; choose a mode that allows it"
            )
            result = ToolResult.refusal(f"{tool.name} was not run: {reason} ({hint})")
            self._record(log, kind, "denied", "non-interactive", result, t0)
            return result
        request = ApprovalRequest(
            tool=tool.name,
            args=args,
            kind=kind,
            preview=planned.preview,
            reason=reason,
            unsandboxed=unsandboxed,
            suggested_rule=None if unsandboxed else suggest_rule(tool.name, args),
        )
        response = self._ask(request)
        if response.decision is Decision.DENY:
            note = f": {response.message}" if response.message else ""
            result = ToolResult.refusal(f"the user denied {tool.name}{note}")
            self._record(log, kind, "denied", "user:deny", result, t0)
            return result
        decided_by = "user:once"
        if response.decision is Decision.ALLOW_ALWAYS and not unsandboxed:
            rule = response.rule or request.suggested_rule
            if rule is not None:
                self.policy.remember(rule)
                decided_by = f"user:always:{rule.describe()}"
        return self._run(planned, log, kind, decided_by, t0)

    def _ask(self, request: ApprovalRequest) -> ApprovalResponse:
        assert self.approver is not None
        try:
            answer = self.approver(request)
        except Exception as e:  # a broken UI callback denies rather than allows
            return ApprovalResponse(Decision.DENY, message=f"approval failed: {e}")
        if isinstance(answer, Decision):
            return ApprovalResponse(answer)
        if isinstance(answer, ApprovalResponse):
            return answer
        return ApprovalResponse(Decision.DENY, message="approval callback returned no decision")

    def _run(
        self, planned: Prepared, log: dict[str, Any], kind: str, decided_by: str, t0: float
    ) -> ToolResult:
        result = planned.run()
        self._record(log, kind, "allowed", decided_by, result, t0)
        return result

    def _invalid(self, log: dict[str, Any], kind: str | None, message: str) -> ToolResult:
        result = ToolResult.failure(message)
        self.audit.record(
            AuditEntry(**log, kind=kind, decision="invalid", decided_by="validation", ok=False, error=message)
        )
        return result

    def _record(
        self, log: dict[str, Any], kind: str, decision: str, decided_by: str, result: ToolResult, t0: float
    ) -> None:
        ran = decision == "allowed"
        self.audit.record(
            AuditEntry(
                **log,
                kind=kind,
                decision=decision,
                decided_by=decided_by,
                ok=result.ok if ran else None,
                error=result.error,
                sandboxed=result.meta.get("sandboxed"),
                duration_s=round(time.monotonic() - t0, 4),
            )
        )
