"""Permission modes, approval requests, 'always allow' rules and the audit log."""

from mkcode.tools.permissions.approval import ApprovalRequest, ApprovalResponse, Approver, Decision
from mkcode.tools.permissions.audit import AuditEntry, AuditLog
from mkcode.tools.permissions.modes import PermissionMode
from mkcode.tools.permissions.policy import PermissionPolicy, Verdict
from mkcode.tools.permissions.rules import AllowRule, simple_command_words, suggest_rule

__all__ = [
    "AllowRule",
    "ApprovalRequest",
    "ApprovalResponse",
    "Approver",
    "AuditEntry",
    "AuditLog",
    "Decision",
    "PermissionMode",
    "PermissionPolicy",
    "Verdict",
    "simple_command_words",
    "suggest_rule",
]
