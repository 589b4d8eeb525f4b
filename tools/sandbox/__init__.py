"""The shell sandbox: bubblewrap namespaces, scrubbed environment, time/output/process limits."""

from mkcode.tools.sandbox.env import scrub_environment
from mkcode.tools.sandbox.limits import ShellLimits
from mkcode.tools.sandbox.probe import SandboxStatus, probe_sandbox
from mkcode.tools.sandbox.runner import SandboxSettings, ShellOutcome, run_shell_command

__all__ = [
    "SandboxSettings",
    "SandboxStatus",
    "ShellLimits",
    "ShellOutcome",
    "probe_sandbox",
    "run_shell_command",
    "scrub_environment",
]
