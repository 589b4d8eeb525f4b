"""A disk budget per command: a runaway (or hostile) command cannot fill the user's disk.

The budget here is 64 MiB so each test is fast and small; every writer below would write 512 MiB
or more without it. The promise checked: the command is stopped with the budget's error, and what
it left in the workspace is at most the budget plus TOLERANCE (the watcher samples every few ms).
Files the command wrote are the user's: mkcode does not delete them (the tests do, afterwards).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from mkcode.tools import PermissionMode, SandboxSettings, ShellLimits, ToolRegistry, Workspace
from mkcode.tools.sandbox.disk import DiskWatch, cap_tmpfs
from mkcode.tools.sandbox.limits import wrap_with_limits
from mkcode.tools.sandbox.locate import find_bwrap
from mkcode.tools.sandbox.runner import ShellOutcome, run_shell_command, sandbox_status

MiB = 1024**2
BUDGET = 64 * MiB
# Measured overshoot on a loaded 2-core machine: 0-17 MiB (fallocate of 8 MiB files: one or two files).
# The watcher samples; a busy machine delays it, so the tolerance is generous. Every writer below
# tries 512 MiB, so a missing budget still fails the test.
TOLERANCE = 2 * BUDGET
LIMITS = ShellLimits(disk_bytes=BUDGET, disk_files=None, tmp_bytes=16 * MiB)
FILE_LIMITS = ShellLimits(disk_bytes=1024 * MiB, disk_files=500)  # files alone (bytes far away)
ERROR = "stopped: wrote more than 64.0 MiB to the workspace"


@pytest.fixture
def ws(tmp_path: Path):
    d = tmp_path / "ws"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)  # the test's own files; keep the disk small


@pytest.fixture(params=["sandboxed", "host"])
def sandboxed(request, ws) -> bool:
    on = request.param == "sandboxed"
    if on and not sandbox_status(SandboxSettings(), [str(ws)]).available:
        pytest.skip("bubblewrap is not usable here")
    return on


def _run(ws: Path, command: str, sandboxed: bool = True, limits: ShellLimits = LIMITS) -> ShellOutcome:
    return run_shell_command(
        command,
        roots=[str(ws)],
        cwd=str(ws),
        timeout_s=60,
        settings=SandboxSettings(limits=limits),
        sandboxed=sandboxed,
    )


def _bytes_in(d: Path) -> int:
    return sum(os.stat(os.path.join(root, f)).st_blocks * 512 for root, _, files in os.walk(d) for f in files)


def _assert_stopped(ws: Path, outcome: ShellOutcome) -> None:
    p = outcome.process
    assert p.disk is not None and p.disk.exceeded == "bytes", (p.disk, p.output[-300:])
    assert p.exit_code is None  # killed by the watcher
    assert ERROR in p.disk.describe()
    written = _bytes_in(ws)
    assert written <= BUDGET + TOLERANCE, f"{written / MiB:.1f} MiB written"
    time.sleep(0.2)  # nothing of it keeps writing after the result
    assert _bytes_in(ws) == written


def test_dd_into_many_files_is_stopped(ws, sandboxed):
    cmd = "for i in $(seq 64); do dd if=/dev/zero of=f$i bs=1M count=8 status=none; done"
    _assert_stopped(ws, _run(ws, cmd, sandboxed))


def test_fallocate_is_stopped_outside_the_sandbox(ws):
    # fallocate writes no data (no write_bytes in /proc/PID/io): only the free space shows it.
    if shutil.which("fallocate") is None:
        pytest.skip("no fallocate")
    _assert_stopped(
        ws, _run(ws, "for i in $(seq 64); do fallocate -l 8M g$i || exit 9; done", sandboxed=False)
    )


def test_posix_fallocate_loop_is_stopped_in_the_sandbox(ws):
    # fallocate(2) reserves a whole file in microseconds: 16 of them fit between two samples. The
    # sandbox refuses it (EOPNOTSUPP, seccomp), so libc falls back to writing, which is watched.
    if not sandbox_status(SandboxSettings(), [str(ws)]).available:
        pytest.skip("bubblewrap is not usable here")
    cmd = (
        "python3 -c 'import os\nfor i in range(16):\n"
        '    fd = os.open(f"a{i}", os.O_CREAT | os.O_WRONLY)\n    os.posix_fallocate(fd, 0, 64 << 20)\''
    )
    _assert_stopped(ws, _run(ws, cmd, sandboxed=True))
    out = _run(ws, "fallocate -l 8M direct", sandboxed=True).process.output
    assert "not supported" in out, out


def test_python_write_loop_of_1mib_files_is_stopped(ws, sandboxed):
    cmd = (
        "python3 -c 'import os\nb = os.urandom(1 << 20)\n"
        'for i in range(512):\n    open(f"p{i}", "wb").write(b)\''
    )
    _assert_stopped(ws, _run(ws, cmd, sandboxed))


def test_parallel_background_writers_are_all_stopped(ws, sandboxed):
    cmd = "for j in 1 2 3 4; do (for i in $(seq 128); do head -c 1048576 /dev/zero > s${j}_$i; done) & done; wait"
    _assert_stopped(ws, _run(ws, cmd, sandboxed))


def test_many_empty_files_hit_the_file_budget(ws, sandboxed):
    outcome = _run(ws, "mkdir e && cd e && seq 50000 | xargs touch", sandboxed, FILE_LIMITS)
    disk = outcome.process.disk
    assert disk is not None and disk.exceeded == "files", disk
    assert "more than 500 files" in disk.describe()
    assert sum(len(f) for _, _, f in os.walk(ws)) < 10_000


def test_one_big_file_stops_exactly_at_the_budget(ws):
    # RLIMIT_FSIZE is capped at the disk budget: a single file never passes it, not even by a sample.
    _run(ws, "dd if=/dev/zero of=one bs=1M count=512", sandboxed=False)
    assert (ws / "one").stat().st_size <= BUDGET


def test_file_size_limit_is_reported_in_the_sandbox(ws):
    # Inside the sandbox too the writer dies of SIGXFSZ (no launcher may leave it ignored), and the
    # result says why.
    if not sandbox_status(SandboxSettings(), [str(ws)]).available:
        pytest.skip("bubblewrap is not usable here")
    limits = ShellLimits(disk_bytes=BUDGET, file_size_bytes=16 * MiB)
    reg = ToolRegistry(Workspace(ws), mode=PermissionMode.FULL_AUTO, sandbox=SandboxSettings(limits=limits))
    r = reg.execute("run_shell", {"command": "dd if=/dev/zero of=one bs=1M count=512 status=none"})
    assert not r.ok and "SIGXFSZ" in (r.error or "") and "16.0 MiB" in (r.error or ""), r.error
    assert (ws / "one").stat().st_size == 16 * MiB


@pytest.mark.parametrize("directory", ["/tmp", "/dev/shm"])
def test_sandbox_memory_filesystems_are_size_capped(ws, directory):
    if not sandbox_status(SandboxSettings(), [str(ws)]).available:
        pytest.skip("bubblewrap is not usable here")
    outcome = _run(ws, f"dd if=/dev/zero of={directory}/fill bs=1M count=256 2>&1; ls -l {directory}/fill")
    out = outcome.process.output
    assert "No space left on device" in out, out
    size = int(out.strip().splitlines()[-1].split()[4])
    assert size <= 16 * MiB


def test_registry_reports_the_budget_as_a_clear_error(ws):
    reg = ToolRegistry(
        Workspace(ws),
        mode=PermissionMode.FULL_AUTO,
        sandbox=SandboxSettings(dangerously_no_sandbox=True, limits=LIMITS),
    )
    r = reg.execute("run_shell", {"command": "while :; do head -c 4194304 /dev/zero > f$RANDOM$RANDOM; done"})
    assert not r.ok and ERROR in (r.error or ""), r.error
    assert r.meta["disk_budget_bytes"] == BUDGET and r.meta["disk_used_bytes"] > BUDGET
    assert _bytes_in(ws) <= BUDGET + TOLERANCE


def test_ordinary_writes_under_the_budget_are_not_stopped(ws):
    outcome = _run(ws, "dd if=/dev/zero of=ok bs=1M count=8 status=none && echo done", sandboxed=False)
    assert outcome.process.exit_code == 0 and "done" in outcome.process.output
    assert outcome.process.disk is not None and outcome.process.disk.exceeded is None


def test_file_limit_is_the_disk_budget():
    assert ShellLimits(disk_bytes=BUDGET).file_limit_bytes == BUDGET
    assert ShellLimits(disk_bytes=None, file_size_bytes=BUDGET).file_limit_bytes == BUDGET
    argv, _ = wrap_with_limits(["true"], ShellLimits(disk_bytes=BUDGET), None)
    assert f"--fsize={BUDGET}" in argv


def test_cap_tmpfs_sizes_every_tmpfs_and_only_options():
    bwrap, _ = find_bwrap()
    if bwrap is None:
        pytest.skip("no bwrap")
    argv = ["launcher", bwrap, "--bind", "--tmpfs", "/x", "--tmpfs", "/tmp", "--perms", "0700"]
    argv += ["--tmpfs", "/home", "--remount-ro", "/home", "--", "sh", "--tmpfs", "/y"]
    argv[2:2] = ["--dev", "/dev"]
    out = cap_tmpfs(argv, bwrap, 1000)
    assert out[:4] == ["launcher", bwrap, "--dev", "/dev"]
    assert out[4:8] == ["--size", "1000", "--tmpfs", "/dev/shm"]
    assert out[8:11] == ["--bind", "--tmpfs", "/x"]  # an operand, not the option
    assert out.count("--size") == 3
    assert out[11:15] == ["--size", "1000", "--tmpfs", "/tmp"]
    assert out[-3:] == ["sh", "--tmpfs", "/y"]  # the inner command is untouched


def test_prlimit_planted_on_path_is_not_run(ws, monkeypatch):
    # prlimit runs on the host before the sandbox exists: one found through $PATH (an activated
    # workspace venv) would be a sandboxed command's way out.
    bindir = ws / ".venv" / "bin"
    bindir.mkdir(parents=True)
    fake = bindir / "prlimit"
    fake.write_text(
        f'#!/bin/sh\necho pwned > {ws}/pwned\nwhile [ "$1" != -- ]; do shift; done; shift; exec "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    assert shutil.which("prlimit") == str(fake)
    outcome = _run(ws, "echo hello", sandboxed=False)
    assert "hello" in outcome.process.output
    assert not (ws / "pwned").exists()


def test_a_filesystem_mounted_inside_the_workspace_is_watched_too(ws):
    # The workspace bind is recursive: a disk mounted below it is writable from the sandbox.
    sub = ws / "data"
    sub.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(sub)]).returncode
    ):
        pytest.skip("mounting needs root")
    try:
        outcome = _run(
            ws, "for i in $(seq 64); do head -c 8388608 /dev/zero > data/w$i; done", sandboxed=False
        )
        assert outcome.process.disk is not None and outcome.process.disk.exceeded == "bytes"
        assert _bytes_in(sub) <= BUDGET + TOLERANCE
    finally:
        subprocess.run(["umount", "-l", str(sub)], check=False)


def test_watcher_stops_a_writer_outside_run_shell(ws):
    """The watcher on its own (no rlimit, no sandbox): a plain process writing 512 MiB is killed."""
    watch = DiskWatch([str(ws)], BUDGET)
    proc = subprocess.Popen(
        ["/bin/sh", "-c", "for i in $(seq 64); do head -c 8388608 /dev/zero > w$i; done"],
        cwd=ws,
        start_new_session=True,
    )
    watch.start(lambda: os.killpg(proc.pid, 9))
    proc.wait(timeout=60)
    use = watch.stop()
    assert use.exceeded == "bytes" and proc.returncode == -9
    assert _bytes_in(ws) <= BUDGET + TOLERANCE
