"""The sandbox's scratch folder (tools/sandbox/scratch.py) never outlives its process: removed at a
normal exit, on the front ends' hard exit (`os._exit` skips atexit), and, after a kill, by the next
process's sweep, which touches only this user's real folders named for a pid that is gone."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from mkcode.tools.sandbox import scratch


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _python(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True, **kw
    )


def test_one_private_folder_per_process_named_for_its_pid():
    d = scratch.path()
    try:
        assert os.path.basename(d).startswith(f"{scratch.PREFIX}{os.getpid()}-")
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        assert scratch.path() == d
        scratch.remove()
        assert not os.path.exists(d)
        again = scratch.path()
        assert again != d and os.path.isdir(again)
    finally:
        scratch.remove()


def test_the_sweep_removes_only_this_users_folders_of_dead_processes(tmp_path):
    dead, live = _dead_pid(), os.getppid()
    stale = tmp_path / f"{scratch.PREFIX}{dead}-abcd"
    running = tmp_path / f"{scratch.PREFIX}{live}-abcd"
    mine = tmp_path / f"{scratch.PREFIX}{os.getpid()}-abcd"
    legacy = tmp_path / f"{scratch.PREFIX}k2j4h5"  # no pid in the name: not ours to judge
    other = tmp_path / f"other-{dead}-abcd"
    target = tmp_path / "target"
    for d in (stale, running, mine, legacy, other, target):
        d.mkdir()
        (d / "filter.bpf").write_bytes(b"x")
    link = tmp_path / f"{scratch.PREFIX}{dead}-link"
    link.symlink_to(target, target_is_directory=True)
    plain_file = tmp_path / f"{scratch.PREFIX}{dead}-file"
    plain_file.write_text("x")

    removed = scratch.sweep_stale(str(tmp_path))

    assert removed == [str(stale)]
    assert not stale.exists()
    for kept in (running, mine, legacy, other, target / "filter.bpf", plain_file):
        assert kept.exists(), kept
    assert link.is_symlink()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_the_sweep_leaves_another_users_folder(tmp_path):
    theirs = tmp_path / f"{scratch.PREFIX}{_dead_pid()}-abcd"
    theirs.mkdir()
    os.chown(theirs, 54321, 54321)
    assert scratch.sweep_stale(str(tmp_path)) == []
    assert theirs.is_dir()


def test_a_hard_exit_with_a_stuck_thread_removes_the_folder():
    proc = _python(
        """
        import threading, time
        from mkcode.tools.sandbox import scratch
        from mkcode.app.core.process_exit import leave
        print(scratch.path(), flush=True)
        threading.Thread(target=time.sleep, args=(3600,)).start()  # not daemon: blocks a normal exit
        leave(7, grace_s=0.1)
        """
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7
    d = out.strip()
    assert d.startswith(os.path.join(os.path.dirname(d), scratch.PREFIX))
    assert not os.path.exists(d)


def test_a_killed_processs_folder_goes_with_the_next_sweep():
    proc = _python(
        """
        import sys, time
        from mkcode.tools.sandbox import scratch
        print(scratch.path(), flush=True)
        time.sleep(3600)
        """
    )
    d = proc.stdout.readline().strip()
    assert os.path.isdir(d)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert os.path.isdir(d)  # nothing ran at the kill
    assert d in scratch.sweep_stale(os.path.dirname(d))
    assert not os.path.exists(d)


def test_a_forked_child_leaves_its_parents_folder():
    d = scratch.path()
    try:
        pid = os.fork()
        if pid == 0:  # the child exits through atexit-free os._exit after remove()
            scratch.remove()
            os._exit(0 if os.path.isdir(d) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.isdir(d) and scratch.path() == d
    finally:
        scratch.remove()
