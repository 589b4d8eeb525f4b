"""run_shell: a bash command in the workspace, inside the bubblewrap sandbox."""

from __future__ import annotations

import math
import signal
from typing import Any

from mkcode.tools.result import ToolResult
from mkcode.tools.sandbox.disk import human_bytes
from mkcode.tools.sandbox.limits import ShellLimits
from mkcode.tools.sandbox.runner import ShellOutcome, run_shell_command, sandbox_status
from mkcode.tools.spec import Prepared, Tool, ToolContext, ToolKind, object_schema

# One argv string may hold at most 128 KiB (MAX_ARG_STRLEN); 30k characters fit even at 4 UTF-8 bytes each.
COMMAND_MAX_CHARS = 30_000


class RunShell(Tool):
    name = "run_shell"
    kind = ToolKind.SHELL
    description = (
        "Run a bash command in the workspace root and return its combined stdout and stderr and "
        "exit code. It runs in a sandbox: the workspace is writable, the rest of the filesystem is "
        "read-only, /tmp is private and empty, there is no network, .git hooks and config are "
        "read-only, and secrets are removed from the environment. No stdin (do not run "
        "interactive programs). timeout: seconds (default 120, max 600); the whole process tree "
        "is killed when it expires, or when the command fills the disk past its budget (2 GiB "
        "written to the workspace by default). Long output keeps its beginning and end."
    )
    parameters = object_schema(
        {
            "command": {
                "type": "string",
                "minLength": 1,
                "maxLength": COMMAND_MAX_CHARS,
                "description": "The bash command line.",
            },
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": ShellLimits().max_timeout_s,
                "description": "Wall-time limit in seconds.",
            },
        },
        ["command"],
    )

    def prepare(self, ctx: ToolContext, args: dict[str, Any]) -> Prepared | ToolResult:
        command: str = args["command"]
        if not command.strip():
            return ToolResult.failure("command is empty")
        if "\x00" in command:
            return ToolResult.failure("command contains a NUL byte")
        limits = ctx.sandbox.limits
        timeout = float(args.get("timeout", limits.default_timeout_s))
        if not math.isfinite(timeout) or timeout <= 0:  # the schema refuses these; prepare() trusts no caller
            return ToolResult.failure("timeout must be a finite number of seconds greater than 0")
        if timeout > limits.max_timeout_s:
            return ToolResult.failure(f"timeout {timeout:g}s is over the {limits.max_timeout_s:g}s maximum")
        roots = ctx.workspace.roots
        unsandboxed_reason: str | None = None
        sandboxed = True
        if ctx.sandbox.dangerously_no_sandbox:
            sandboxed = False  # the user's explicit setting; the audit log records it
        else:
            status = sandbox_status(ctx.sandbox, roots)
            if not status.available:
                sandboxed = False
                unsandboxed_reason = status.explain()

        def run(sandboxed: bool = sandboxed) -> ToolResult:
            outcome = run_shell_command(
                command,
                roots=roots,
                cwd=ctx.workspace.root,
                timeout_s=timeout,
                settings=ctx.sandbox,
                sandboxed=sandboxed,
                cancel=ctx.cancel,
            )
            return shell_result(outcome, timeout)

        preview = f"$ {command}" + ("" if sandboxed else "\n(runs OUTSIDE the sandbox)")
        return Prepared(
            preview=preview, run=run, unsandboxed_reason=unsandboxed_reason, meta={"sandboxed": sandboxed}
        )


def shell_result(outcome: ShellOutcome, timeout: float) -> ToolResult:
    p = outcome.process
    lines = [p.output.rstrip("\n")] if p.output else []
    problems: list[str] = []
    if p.timed_out:
        problems.append(f"timed out after {timeout:g}s; the command and all its processes were killed")
    if p.flooded:
        problems.append(f"stopped after writing {p.output_bytes} bytes of output (output flood); killed")
    if p.cancelled:
        problems.append("cancelled by the user; killed")
    if p.disk is not None and p.disk.exceeded:
        problems.append(p.disk.describe())
    elif p.exit_code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) and outcome.file_limit_bytes:
        problems.append(
            f"killed by SIGXFSZ: a file reached the per-file size limit "
            f"({human_bytes(outcome.file_limit_bytes)}, the disk budget)"
        )
    if outcome.pid_limit_hits:
        problems.append(
            f"hit the sandbox's process limit ({outcome.pid_limit_hits} forks refused; fork bomb or runaway "
            "parallelism?)"
        )
    if p.exit_code not in (None, 0):
        problems.append(f"exit code {p.exit_code}" if p.exit_code > 0 else f"killed by signal {-p.exit_code}")
    status = f"[exit code: {p.exit_code}]" if p.exit_code is not None else "[killed]"
    if p.truncated:
        status += f" [output truncated: {p.output_bytes} bytes total]"
    if not outcome.sandboxed:
        status += " [ran outside the sandbox]"
    if outcome.env_secret_values:
        names = ", ".join(outcome.env_secret_values)
        status += f" [not passed, the value looked like a credential: {names}]"
    lines.append(status)
    output = "\n".join(lines)
    meta = {
        "exit_code": p.exit_code,
        "timed_out": p.timed_out,
        "truncated": p.truncated,
        "output_bytes": p.output_bytes,
        "sandboxed": outcome.sandboxed,
        "duration_s": round(p.duration_s, 3),
        "pid_limit_hits": outcome.pid_limit_hits,
        "processes_limited": outcome.processes_limited,
        "env_removed": list(outcome.env_removed),
        "env_secret_values": list(outcome.env_secret_values),
        "notes": list(outcome.notes),
        "disk_used_bytes": p.disk.used_bytes if p.disk is not None else None,
        "disk_budget_bytes": p.disk.budget_bytes if p.disk is not None else None,
    }
    if problems:
        return ToolResult.failure("; ".join(problems), output=output, **meta)
    return ToolResult.success(output, **meta)
