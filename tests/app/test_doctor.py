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


def _quick(monkeypatch) -> None:
    """The machine checks replaced by fixed answers (no torch import, no sandbox probe)."""

    def gpu(f):
        doctor._line("GPU / driver", False, "nvidia-smi not found", doctor.DRIVER_FIX)
        f.check("GPU / driver", False)

    monkeypatch.setattr(doctor, "_gpu", gpu)
    monkeypatch.setattr(doctor, "_torch", lambda f: setattr(f, "torch", True))
    monkeypatch.setattr(doctor, "_megakernel", lambda f, build: None)
    monkeypatch.setattr(doctor, "_sandbox", lambda: True)


class _Flushes:
    """A stdout that only shows what was flushed: what a user sees while the command runs."""

    def __init__(self) -> None:
        self.buffer, self.seen = "", []

    def write(self, s: str) -> int:
        self.buffer += s
        return len(s)

    def flush(self) -> None:
        self.seen.append(self.buffer)

    def isatty(self) -> bool:
        return False


def test_every_line_is_shown_as_its_check_ends(monkeypatch, tmp_path):
    _quick(monkeypatch)
    monkeypatch.setenv("MKCODE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("MKCODE_ENDPOINT", raising=False)
    out = _Flushes()
    monkeypatch.setattr("sys.stdout", out)
    doctor.run(argparse.Namespace(build=False))
    lines = [line for line in out.buffer.splitlines() if line.startswith("[")]
    assert len(lines) >= 4
    for line in lines:  # each check's line was on screen before the next check started
        first = next(i for i, seen in enumerate(out.seen) if line in seen)
        later = [other for other in lines if lines.index(other) > lines.index(line)]
        assert all(other not in out.seen[first] for other in later)


def test_failures_name_their_fix_and_the_summary_says_what_works(monkeypatch, tmp_path, capsys):
    _quick(monkeypatch)
    bad = tmp_path / "config.toml"
    bad.write_text("mode = 'nonsense'\n")
    monkeypatch.setenv("MKCODE_CONFIG", str(bad))
    code = doctor.run(argparse.Namespace(build=False))
    out = capsys.readouterr().out
    assert code == 1
    lines = out.splitlines()
    fails = [i for i, line in enumerate(lines) if line.startswith("[FAIL]")]
    assert any("config" in lines[i] for i in fails)
    for i in fails:
        assert lines[i + 1].strip().startswith("fix: "), lines[i]
    summary = out.split("On this machine:")[1]
    assert "yes the assistant on the demo model" in summary
    assert "no  North Mini Code in process on a GPU" in summary
    assert "[  ok] demo model         mkcode-demo v" in out and "checksums verified" in out


def test_an_unreachable_endpoint_fails_with_its_fix(monkeypatch, capsys):
    f = doctor.Findings(endpoint="http://127.0.0.1:9/v1")
    doctor._server(f)
    out = capsys.readouterr().out
    assert out.startswith("[FAIL] server") and "fix: start it (mkcode serve)" in out
    assert f.failed == ["server"] and f.server is False


def test_no_server_is_not_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "LOCAL_SERVER", "http://127.0.0.1:9/v1")
    f = doctor.Findings()
    doctor._server(f)
    assert capsys.readouterr().out.startswith("[  --] server") and f.failed == [] and f.server is None


def test_a_damaged_demo_model_fails_with_its_fix(monkeypatch, capsys):
    import mkcode.backend.demo.shipped as shipped

    def damaged(directory=None):
        raise shipped.DemoModelError(
            f"the demo model file x does not match its checksum. {shipped.RETRAIN_HINT}"
        )

    monkeypatch.setattr(shipped, "shipped_demo_model", damaged)
    f = doctor.Findings()
    doctor._demo(f)
    out = capsys.readouterr().out
    assert out.startswith("[FAIL] demo model") and "fix: Reinstall mkcode" in out and not f.demo
