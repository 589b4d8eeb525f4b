"""run_shell inside bubblewrap, attacked: escapes, network, secrets, fork bombs, floods, hangs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mkcode.tools import PermissionMode, SandboxSettings, ShellLimits, ToolRegistry, Workspace
from mkcode.tools.sandbox.limits import CgroupJail

from .conftest import processes_matching

pytestmark = pytest.mark.usefixtures("sandbox_available")


def test_basic_command_runs_in_workspace(shell, ws_dir: Path):
    r = shell("pwd; echo made > made.txt; cat hello.txt | wc -l")
    assert r.ok, r
    assert r.output.splitlines()[:2] == [str(ws_dir), "3"]
    assert r.meta["sandboxed"] is True and r.meta["exit_code"] == 0
    assert (ws_dir / "made.txt").read_text() == "made\n"


def test_nonzero_exit_is_reported(shell):
    r = shell("echo oops >&2; exit 7")
    assert not r.ok and r.error == "exit code 7" and "oops" in r.output and "[exit code: 7]" in r.output


@pytest.mark.parametrize("target", ["/etc", "/root", "/usr/local", "/var/tmp", "OUTSIDE"])
def test_writes_outside_workspace_are_contained(shell, outside: Path, target: str):
    directory = str(outside) if target == "OUTSIDE" else target
    name = f"mkcode-escape-{uuid.uuid4().hex}"
    r = shell(f"echo pwned > {directory}/{name}; echo rc=$?")
    if target == "/root" and os.path.realpath(os.path.expanduser("~")) == "/root":
        assert "rc=0" in r.output, r.output  # the private, empty home (deny by default), thrown away after
    else:  # read-only everywhere (Landlock: denied); a directory under the host's /tmp is not even visible
        assert any(
            e in r.output for e in ("Read-only file system", "No such file or directory", "Permission denied")
        ), r.output
        assert "rc=1" in r.output
    assert not os.path.exists(os.path.join(directory, name))


def test_host_tmp_is_private(shell):
    name = f"mkcode-escape-{uuid.uuid4().hex}"
    r = shell(f"echo pwned > /tmp/{name} && ls /tmp")
    assert r.ok and name in r.output  # writable inside...
    assert not os.path.exists(f"/tmp/{name}")  # ...but never on the host


def test_secret_files_in_home_are_hidden(shell, tmp_path: Path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".netrc").write_text("machine x password hunter2\n")
    monkeypatch.setenv("HOME", str(home))
    r = shell(f"cat {home}/.ssh/id_ed25519 {home}/.netrc; ls -a {home}/.ssh")
    assert "PRIVATE KEY" not in r.output and "hunter2" not in r.output


def test_no_network_even_to_host_loopback(shell):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]
    srv.setblocking(False)
    try:
        code = (
            "import socket\n"
            "for host in ('127.0.0.1', 'localhost', '10.0.2.2', '1.1.1.1'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=2); print(host, 'CONNECTED')\n"
            "    except OSError as e: print(host, 'blocked', e)\n"
        )
        # the real interpreter, not a venv link: a venv under /tmp is hidden by the private /tmp
        python = os.path.realpath(sys.executable)
        r = shell(f'{python} -c "{code}"; cat /proc/net/dev')
        assert "CONNECTED" not in r.output, r.output
        assert r.output.count("blocked") == 4
        dev_lines = r.output.split("bytes    packets")[-1].splitlines()  # after /proc/net/dev's header
        interfaces = [line.split(":")[0].strip() for line in dev_lines if ":" in line and "[" not in line]
        assert interfaces == ["lo"], r.output
        with pytest.raises(BlockingIOError):
            srv.accept()  # the host listener never saw a connection
    finally:
        srv.close()


def test_secrets_are_scrubbed_from_environment(shell, monkeypatch):
    secrets = {
        "OPENAI_API_KEY": "sk-abcdefghijklmnopqrstuv",
        "GITHUB_TOKEN": "ghp_abcdefghijklmnopqrstuvwx",
        "DB_PASSWORD": "hunter2hunter2",
        "MY_CREDENTIALS_FILE": "/secret/creds",
        "DATABASE_URL": "postgres://user:pa55word@db.internal/app",
        "HARMLESS_NAME": "sk-live0123456789abcdef",
        "SSH_AUTH_SOCK": "/run/user/0/ssh-agent",
    }
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("VIRTUAL_ENV", "/opt/visible-venv")  # on the allow list
    r = shell("env")
    assert r.ok
    for k, v in secrets.items():
        assert k not in r.output and v not in r.output, k
    assert (
        "VIRTUAL_ENV=/opt/visible-venv" in r.output and "PATH=" in r.output and "MKCODE_SANDBOX=1" in r.output
    )
    assert set(secrets) <= set(r.meta["env_removed"])


def test_fork_bomb_is_contained(workspace: Workspace):
    limits = ShellLimits(max_processes=64)
    jail = CgroupJail.create(limits)
    jail.cleanup()
    if not jail.limits_processes and os.geteuid() == 0:
        pytest.skip(f"no writable pids cgroup here and RLIMIT_NPROC does not bind root: {jail.notes}")
    reg = ToolRegistry(workspace, mode=PermissionMode.FULL_AUTO, sandbox=SandboxSettings(limits=limits))
    t0 = time.monotonic()
    r = reg.execute("run_shell", {"command": "bomb() { bomb | bomb & }; bomb; sleep 1", "timeout": 4})
    assert time.monotonic() - t0 < 10
    if jail.limits_processes:
        assert not r.ok and "process limit" in (r.error or ""), r
        assert r.meta["pid_limit_hits"] > 0
    else:  # RLIMIT_NPROC (a non-root user without a writable pids cgroup): forks fail, uncounted
        assert "Resource temporarily unavailable" in r.output, r
    # The host is fine: it can still start processes, and nothing of the bomb is left.
    assert subprocess.run(["true"], check=False).returncode == 0
    time.sleep(0.2)
    assert processes_matching("bomb() {") == []


def test_endless_output_is_capped(shell):
    t0 = time.monotonic()
    r = shell("yes mkcode", timeout=30)
    assert time.monotonic() - t0 < 20
    assert not r.ok and "output flood" in (r.error or "")
    assert "output truncated" in r.output
    assert len(r.output) < 31_000 + 200
    assert r.output.startswith("mkcode\nmkcode")


def test_long_output_keeps_head_and_tail(shell):
    r = shell("seq 1 200000")
    assert r.ok and r.meta["truncated"]
    lines = r.output.splitlines()
    assert lines[:3] == ["1", "2", "3"] and "200000" in lines[-2]
    assert any("output truncated" in line for line in lines)


def test_sleep_forever_is_killed_with_its_whole_group(shell):
    marker = str(900000 + os.getpid() % 90000)
    t0 = time.monotonic()
    r = shell(
        f"sleep {marker}1 & setsid sleep {marker}2 & (trap '' TERM HUP; sleep {marker}3) & sleep {marker}4",
        timeout=1,
    )
    elapsed = time.monotonic() - t0
    assert not r.ok and "timed out after 1s" in (r.error or "") and r.meta["timed_out"]
    assert elapsed < 5
    time.sleep(0.2)
    assert processes_matching(f"sleep {marker}") == []


def test_background_process_does_not_outlive_command(shell):
    marker = str(800000 + os.getpid() % 90000)
    r = shell(f"(sleep {marker} &) ; nohup sleep {marker} >/dev/null 2>&1 & echo started")
    assert r.ok and "started" in r.output
    time.sleep(0.2)
    assert processes_matching(f"sleep {marker}") == []


def test_git_dir_is_read_only(shell, ws_dir: Path):
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(ws_dir)], check=True)
    config_before = (ws_dir / ".git" / "config").read_bytes()
    r = shell(
        "echo 'touch /tmp/pwned' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit;"
        "echo '[core] fsmonitor = evil' >> .git/config;"
        "rm -rf .git/hooks; rm -f .git/config; mv .git .git-moved;"
        "git status --short && echo STATUS-OK;"
        "git -c user.email=a@b -c user.name=n add hello.txt && "
        "git -c user.email=a@b -c user.name=n commit -qm sandboxed && echo COMMITTED"
    )
    assert "Read-only file system" in r.output
    assert "STATUS-OK" in r.output, r.output  # reading the repository still works
    assert "COMMITTED" not in r.output, r.output  # committing is a step outside the sandbox
    assert not (ws_dir / ".git" / "hooks" / "pre-commit").exists()
    assert (ws_dir / ".git" / "config").read_bytes() == config_before
    assert not (ws_dir / ".git-moved").exists()


def test_cancel_event_stops_a_command(workspace: Workspace):
    import threading

    reg = ToolRegistry(workspace, mode=PermissionMode.FULL_AUTO)
    reg.context.cancel = threading.Event()
    threading.Timer(0.3, reg.context.cancel.set).start()
    t0 = time.monotonic()
    r = reg.execute("run_shell", {"command": "sleep 30", "timeout": 20})
    assert not r.ok and "cancelled" in (r.error or "") and time.monotonic() - t0 < 5


def test_timeout_over_maximum_is_rejected(shell):
    r = shell("true", timeout=10_000)
    assert not r.ok and "maximum" in (r.error or "")
