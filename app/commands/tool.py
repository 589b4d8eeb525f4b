"""`mkcode tool NAME --workspace DIR --args JSON`: run one tool exactly as the agent does.

Non-interactive: anything the permission mode would ask about is denied. Prints one JSON object
({"ok": ..., "output"/"error": ...}); exit code 0 on success, 1 on a tool error, 3 on a denial.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK = 0
EXIT_TOOL_ERROR = 1
EXIT_DENIED = 3
MODES = ("ask", "auto-edit", "full-auto")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tool",
        help="run one agent tool (read_file, grep, edit_file, run_shell, ...) and print JSON",
        description=(
            "Run one tool exactly as the agent does, non-interactively: anything that would ask "
            "for approval is denied. Prints one JSON object; exit 0 ok, 1 tool error, 3 denied."
        ),
    )
    p.add_argument("name", nargs="?", help="tool name (see --list)")
    p.add_argument("--workspace", "-w", default=".", help="workspace root (default: current directory)")
    p.add_argument("--args", "-a", default="{}", help="tool arguments as a JSON object")
    p.add_argument("--mode", choices=MODES, default="ask", help="permission mode (default: ask)")
    p.add_argument(
        "--dangerously-no-sandbox",
        action="store_true",
        help="run shell commands on the host without bubblewrap (no isolation at all)",
    )
    p.add_argument("--audit-log", metavar="FILE", help="append the audit record (JSONL) to FILE")
    p.add_argument("--list", action="store_true", help="print the tool specs (name, description, schema)")
    p.add_argument("--probe-sandbox", action="store_true", help="probe bubblewrap and print the result")
    p.set_defaults(func=run)


def _print(obj: dict[str, Any]) -> None:
    from mkcode.tools.text import json_terminal_safe  # C1 and bidi characters as \u escapes

    sys.stdout.write(json_terminal_safe(json.dumps(obj, ensure_ascii=False, indent=None)) + "\n")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    from mkcode.tools import (
        AuditLog,
        PermissionMode,
        SandboxSettings,
        ToolRegistry,
        Workspace,
        probe_sandbox,
    )

    try:
        ws = Workspace(args.workspace)
    except ValueError as e:
        _print({"ok": False, "error": str(e)})
        return EXIT_TOOL_ERROR
    if args.probe_sandbox:
        status = probe_sandbox(None, ws.roots, refresh=True)
        _print(
            {
                "ok": status.available,
                "bwrap": status.bwrap,
                "reason": status.reason,
                "fix": status.fix,
                "notes": list(status.notes),
                "layers": list(status.layers),  # namespaces, seccomp, Landlock (or why it is absent)
            }
        )
        return EXIT_OK if status.available else EXIT_TOOL_ERROR
    registry = ToolRegistry(
        ws,
        mode=PermissionMode.parse(args.mode),
        approver=None,  # non-interactive
        sandbox=SandboxSettings(dangerously_no_sandbox=args.dangerously_no_sandbox),
        audit=AuditLog(args.audit_log) if args.audit_log else None,
    )
    if args.list:
        _print({"ok": True, "tools": [s.to_openai()["function"] for s in registry.specs()]})
        return EXIT_OK
    if not args.name:
        _print({"ok": False, "error": f"no tool name given; available: {', '.join(registry.names())}"})
        return EXIT_TOOL_ERROR
    result = registry.execute(args.name, args.args)
    _print(result.to_dict())
    if result.ok:
        return EXIT_OK
    return EXIT_DENIED if result.denied else EXIT_TOOL_ERROR
