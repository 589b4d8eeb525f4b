"""mkcode.tools: the tools the model calls, their sandbox and permission policy.

No torch and no Textual in here (docs/ENGINE.md, Layout). The agent loop uses:

    ws = Workspace("/path/to/project")
    registry = ToolRegistry(ws, mode=PermissionMode.ASK, approver=ask_user, audit=AuditLog())
    registry.openai_tools()               # tool schemas for the chat template
    result = registry.execute(name, args) # ToolResult, never raises
    result.for_model()                    # text for the tool message

execute() blocks (a shell command may run for minutes): call it from a worker thread, e.g.
`await asyncio.to_thread(registry.execute, name, args)`. The approver is then called on that
thread and must return ApprovalResponse/Decision (a UI marshals the question to its own thread).
Setting `registry.context.cancel` (a threading.Event) lets the UI interrupt a running command.
"""

from mkcode.tools.permissions import (
    AllowRule,
    ApprovalRequest,
    ApprovalResponse,
    Approver,
    AuditEntry,
    AuditLog,
    Decision,
    PermissionMode,
    PermissionPolicy,
)
from mkcode.tools.registry import ToolRegistry
from mkcode.tools.result import ToolResult
from mkcode.tools.sandbox import SandboxSettings, SandboxStatus, ShellLimits, probe_sandbox
from mkcode.tools.spec import Tool, ToolContext, ToolKind, ToolSpec
from mkcode.tools.workspace import PathError, Workspace

__all__ = [
    "AllowRule",
    "ApprovalRequest",
    "ApprovalResponse",
    "Approver",
    "AuditEntry",
    "AuditLog",
    "Decision",
    "PathError",
    "PermissionMode",
    "PermissionPolicy",
    "SandboxSettings",
    "SandboxStatus",
    "ShellLimits",
    "Tool",
    "ToolContext",
    "ToolKind",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "Workspace",
    "probe_sandbox",
]
