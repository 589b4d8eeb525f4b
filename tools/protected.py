"""Paths that neither the file tools nor a sandboxed command may touch, whatever the workspace is.

One list, used by both layers: the file tools (tools/workspace.py) refuse them, the sandbox
(tools/sandbox/bwrap.py) masks or mounts them read-only. Two classes:

- secret:   neither readable nor writable (credentials, keys, tokens, shell histories, mkcode's
            own configuration and session data).
- readonly: readable, never writable: anything whose content runs as the user later, outside the
            sandbox (shell start-up files, git/ssh/pip configuration, user site-packages, the
            editor's start-up files), and mkcode's own installation, interpreter and caches of
            code it loads (a built kernel extension is loaded into the host process).

Entries are absolute paths; a path is protected when it is an entry or lies below one. The lists
are deliberately broad: a false positive costs the model one refused read, a false negative costs
the user's machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

# Relative to $HOME: credentials and anything that holds them.
HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/op",
    ".config/rclone",
    ".config/doctl",
    ".config/heroku",
    ".config/netlify",
    ".config/configstore",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".mozilla",
    ".thunderbird",
    ".password-store",
    ".local/share/keyrings",
    ".local/share/mkcode",  # mkcode's sessions: past conversations, tool outputs
    ".config/mkcode",  # mkcode's configuration (endpoint keys, permission rules)
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".pypirc",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".m2/settings-security.xml",
    ".gradle/gradle.properties",
    ".ivy2/.credentials",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".pgpass",
    ".my.cnf",
    ".mylogin.cnf",
    ".s3cfg",
    ".boto",
    ".databrickscfg",
    ".huggingface",
    ".cache/huggingface/token",
    ".bash_history",
    ".zsh_history",
    ".zhistory",
    ".history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".node_repl_history",
    ".lesshst",
    ".viminfo",
    ".local/share/fish/fish_history",
)

# Relative to $HOME: read by programs that run later on the host (outside any sandbox).
HOME_READONLY = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".bash_aliases",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".kshrc",
    ".cshrc",
    ".tcshrc",
    ".inputrc",
    ".pam_environment",
    ".xprofile",
    ".xinitrc",
    ".xsession",
    ".xsessionrc",
    ".config/fish",
    ".config/environment.d",
    ".config/autostart",
    ".config/systemd",
    ".config/git",
    ".gitconfig",
    ".gitattributes",
    ".config/pip",
    ".pip",
    ".pydistutils.cfg",
    ".condarc",
    ".local/bin",
    ".local/lib",  # user site-packages: imported by every host Python
    ".local/share/applications",
    ".config/nvim",
    ".vimrc",
    ".vim",
    ".emacs",
    ".emacs.d",
    ".config/emacs",
    ".tmux.conf",
    ".config/tmux",
    ".screenrc",
    ".direnvrc",
    ".config/direnv",
    ".ipython",
    ".jupyter",
    ".cache/mkcode",  # built kernel extensions (loaded into mkcode's process) and the demo model
    ".config/Code",
    ".vscode",
    ".cursor",
)

# System files readable by root alone that hold secrets; masked when the sandbox's host uid is 0.
SYSTEM_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/var/lib/sss",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/proc/kcore",
)


class Protection(Enum):
    SECRET = "secret"  # neither read nor written
    READONLY = "readonly"  # read, never written


@dataclass(frozen=True)
class ProtectedPaths:
    secret: tuple[str, ...]
    readonly: tuple[str, ...]

    def classify(self, path: str) -> Protection | None:
        """SECRET when `path` is a secret entry or below one; READONLY likewise; else None.

        `path` must be absolute and normalised (the callers resolve symlinks first). A directory
        that *contains* a protected entry is not itself protected (listing $HOME is fine).
        """
        if _under_any(path, self.secret):
            return Protection.SECRET
        if _under_any(path, self.readonly):
            return Protection.READONLY
        return None

    def inside(self, directory: str) -> tuple[str, ...]:
        """The protected entries at or below `directory` (what a bind of it must mask)."""
        return tuple(p for p in (*self.secret, *self.readonly) if _under(p, directory))


def _under(path: str, entry: str) -> bool:
    entry = entry.rstrip("/") or "/"
    return path == entry or path.startswith(entry + "/") or entry == "/"


def _under_any(path: str, entries: Iterable[str]) -> bool:
    return any(_under(path, e) for e in entries)


def installation_paths() -> tuple[str, ...]:
    """mkcode's own code and interpreter: the package folders and the environment it runs in."""
    found: list[str] = []
    import mkcode.tools as _tools_pkg  # this package's folder; app/ and backend/ sit beside it

    pkg_parent = os.path.dirname(os.path.dirname(os.path.realpath(_tools_pkg.__file__)))
    for name in ("app", "backend", "tools", "csrc"):
        p = os.path.join(pkg_parent, name)
        if os.path.isdir(p):
            found.append(p)
    mk = sys.modules.get("mkcode")
    mk_file = getattr(mk, "__file__", None) if mk is not None else None
    if mk_file:  # a regular (non-editable) install: the mkcode package folder itself
        found.append(os.path.dirname(os.path.realpath(mk_file)))
    for prefix in {sys.prefix, sys.exec_prefix, sys.base_prefix}:
        if prefix and prefix != "/":
            found.append(os.path.realpath(prefix))
    exe = os.path.realpath(sys.executable)
    if exe:
        found.append(exe)
    return tuple(dict.fromkeys(found))


def _home(env: Mapping[str, str]) -> str | None:
    home = env.get("HOME") or os.path.expanduser("~")
    home = os.path.realpath(home) if home else ""
    return home if home not in ("", "/") else None


def _xdg(env: Mapping[str, str], var: str, default_rel: str, home: str | None) -> str | None:
    base = env.get(var) or (os.path.join(home, default_rel) if home else None)
    return os.path.realpath(os.path.join(base, "mkcode")) if base else None


@lru_cache(maxsize=8)
def _protected_cached(
    home: str | None,
    xdg: tuple[str | None, str | None, str | None],
    extra_secret: tuple[str, ...],
    extra_readonly: tuple[str, ...],
) -> ProtectedPaths:
    secret: list[str] = list(SYSTEM_SECRETS)
    readonly: list[str] = list(installation_paths())
    if home:
        secret += [os.path.join(home, rel) for rel in HOME_SECRETS]
        readonly += [os.path.join(home, rel) for rel in HOME_READONLY]
    config_dir, data_dir, cache_dir = xdg
    secret += [p for p in (config_dir, data_dir) if p]
    readonly += [p for p in (cache_dir, os.environ.get("MKCODE_KERNEL_CACHE")) if p]
    secret += [os.path.realpath(p) for p in extra_secret]
    readonly += [os.path.realpath(p) for p in extra_readonly]
    return ProtectedPaths(secret=tuple(dict.fromkeys(secret)), readonly=tuple(dict.fromkeys(readonly)))


def protected_paths(
    env: Mapping[str, str] | None = None,
    extra_secret: Iterable[str] = (),
    extra_readonly: Iterable[str] = (),
) -> ProtectedPaths:
    """The protected paths for this process (its $HOME, XDG folders and installation)."""
    env = os.environ if env is None else env
    home = _home(env)
    xdg = (
        _xdg(env, "XDG_CONFIG_HOME", ".config", home),
        _xdg(env, "XDG_DATA_HOME", ".local/share", home),
        _xdg(env, "XDG_CACHE_HOME", ".cache", home),
    )
    return _protected_cached(home, xdg, tuple(extra_secret), tuple(extra_readonly))
