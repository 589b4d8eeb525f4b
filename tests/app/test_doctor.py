"""`mkcode doctor` reports the sandbox and each of its layers, and fails when it cannot run."""

from __future__ import annotations

import argparse

import pytest

from mkcode.app.commands import doctor
from mkcode.tools.sandbox import probe


def _status(available: bool, abi: int) -> probe.SandboxStatus:
    return probe.SandboxStatus(
        available,
        "/usr/bin/bwrap" if available else None,
        "" if available else "user namespaces are disabled",
        "" if available else "sysctl kernel.unprivileged_userns_clone=1",
        layers=probe.describe_layers(abi),
        landlock_abi=abi,
    )


@pytest.mark.parametrize("abi", [0, 7])
def test_doctor_lists_the_sandbox_layers(monkeypatch, capsys, abi):
    monkeypatch.setattr(probe, "probe_sandbox", lambda *a, **k: _status(True, abi))
    assert doctor._sandbox() is True
    out = capsys.readouterr().out
    assert "[  ok] sandbox" in out and "seccomp" in out and "namespaces" in out
    landlock_line = next(line for line in out.splitlines() if "landlock" in line)
    assert landlock_line.startswith("[  --]" if abi == 0 else "[  ok]"), landlock_line


def test_doctor_fails_with_the_fix_when_the_sandbox_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(probe, "probe_sandbox", lambda *a, **k: _status(False, 0))
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)  # no GPU either: stop early
    code = doctor.run(argparse.Namespace(build=False))
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] sandbox" in out and "fix: sysctl" in out
