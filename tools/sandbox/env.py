"""The environment a sandboxed command gets: an allow list of names, then a check of every value.

A variable reaches the command only when
  1. its name is on the allow list (ALLOWED_NAMES, an LC_* locale name, or a name the user listed in
     the `env_allow` setting; a trailing `*` there allows a prefix), and is not on NEVER_PASSED; and
  2. its value does not look like a credential (a token with a known prefix, a JWT, a private key,
     a URL carrying a password, a key, or a signature, a webhook URL, a long high-entropy string).
Everything else is dropped and its NAME reported (never its value). The value check applies to
names the user allowed too: the sandbox has no network, so a credential inside it has no use but
to be copied somewhere it should not be; a command that needs one runs with the user's approval
outside the sandbox.

Why these names. The environment is handed to the host-side launchers (sh, prlimit, bwrap) before
the sandbox exists, so nothing that changes how a host program loads or starts is passed:
LD_PRELOAD / LD_LIBRARY_PATH / LD_AUDIT (a library in a writable workspace directory would be
loaded by bwrap itself, outside the sandbox), BASH_ENV / ENV and exported bash functions (run by
the shell before the command). Toolchain variables are paths and switches (VIRTUAL_ENV, GOPATH,
CC, CFLAGS, ...) that a build needs and that hold no secrets; a credential placed in one is caught
by the value check. PYTHONPATH is passed: it only steers imports of the sandboxed Python, which
can already import anything it can read. Variables whose purpose is a secret or a door out
(proxies, SSH_AUTH_SOCK, DBUS_SESSION_BUS_ADDRESS, DISPLAY, *_TOKEN, npm_config_*) are not listed.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ALLOWED_NAMES = frozenset(
    {
        # the basics every program expects
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "COLORTERM",
        "NO_COLOR",
        "TZ",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        # Python
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUTF8",
        "PYTHONIOENCODING",
        "PYTHONNOUSERSITE",
        "PYENV_ROOT",
        "PYENV_VERSION",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "CONDA_EXE",
        "CONDA_PYTHON_EXE",
        "CONDA_SHLVL",
        "PIP_NO_INDEX",
        "PIP_FIND_LINKS",
        "PIP_CACHE_DIR",
        "UV_CACHE_DIR",
        "UV_PYTHON",
        # Go
        "GOPATH",
        "GOROOT",
        "GOCACHE",
        "GOMODCACHE",
        "GOFLAGS",
        "GOPROXY",
        "GOTOOLCHAIN",
        "GO111MODULE",
        "CGO_ENABLED",
        # Rust
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
        "RUSTFLAGS",
        # Java
        "JAVA_HOME",
        "MAVEN_HOME",
        "M2_HOME",
        "GRADLE_HOME",
        "GRADLE_USER_HOME",
        # JavaScript
        "NVM_DIR",
        "NVM_BIN",
        "NODE_PATH",
        # C, C++, linking at build time, CUDA
        "CC",
        "CXX",
        "CPP",
        "AR",
        "LD",
        "CFLAGS",
        "CXXFLAGS",
        "CPPFLAGS",
        "LDFLAGS",
        "MAKEFLAGS",
        "PKG_CONFIG_PATH",
        "CMAKE_PREFIX_PATH",
        "CMAKE_GENERATOR",
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_VISIBLE_DEVICES",
        # git identity (no config injection: GIT_CONFIG_*, GIT_SSH_COMMAND, GIT_ASKPASS are not here)
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
    }
)
ALLOWED_PREFIXES = ("LC_",)
# Never passed, even when the user lists them: they change how the host-side launchers run.
NEVER_PASSED = frozenset(
    {
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "LD_DEBUG_OUTPUT",
        "GCONV_PATH",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PROMPT_COMMAND",
        "PS4",
        "IFS",
    }
)
_NEVER_PREFIXES = ("BASH_FUNC_",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")

# Values that are credentials whatever the variable is called. Searched anywhere in the value.
_SECRET_VALUE_PATTERNS = (
    # URL with user:password@ (also an empty user), or a long key as the user (Sentry DSN, ...)
    re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@", re.IGNORECASE),
    re.compile(r"[a-z][a-z0-9+.-]*://[A-Za-z0-9_\-]{16,}@", re.IGNORECASE),
    # URL whose query carries a credential
    re.compile(
        r"[?&](?:access_?token|auth|token|api_?key|key|secret|sig|signature|password|x-amz-signature|"
        r"x-goog-signature|x-amz-credential)=[^&\s]{6,}",
        re.IGNORECASE,
    ),
    # webhook URLs: the URL is the credential
    re.compile(r"https?://hooks\.slack\.com/(?:services|workflows|triggers)/", re.IGNORECASE),
    re.compile(r"https?://(?:[a-z]+\.)?discord(?:app)?\.com/api/webhooks/", re.IGNORECASE),
    re.compile(r"https?://[a-z0-9.-]*webhook\.office\.com/", re.IGNORECASE),
    # tokens with a known prefix
    re.compile(
        r"(?<![A-Za-z0-9])(?:sk-|sk_live_|sk_test_|rk_live_|ghp_|gho_|ghs_|ghu_|ghr_|github_pat_|glpat-|"
        r"gldt-|glrt-|xox[abposr]-|xapp-|AKIA|ASIA|hf_|npm_|pypi-|AIza|ya29\.|GOCSPX-|SG\.|dop_v1_|"
        r"shpat_|shpss_|sq0atp-|EAAC|lin_api_|SK[0-9a-f]{32})[A-Za-z0-9_\-.=]{8,}"
    ),
    # JSON Web Token: base64url({"...) . base64url({"...) . signature
    re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"),
    re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----"),
    re.compile(r"^(?:Bearer|Basic|token)\s+[A-Za-z0-9+/=_\-.~]{12,}$", re.IGNORECASE),
)
# A whole value that is one long opaque token: hex (32+), or base64/base64url-like (24+) with
# enough entropy and a mix of character classes (an AWS secret key is 40 of these).
_HEX_TOKEN = re.compile(r"[0-9a-fA-F]{32,}")
_OPAQUE_TOKEN = re.compile(r"[A-Za-z0-9+/=_\-.~]{24,}")
# An identifier such as a GPU's UUID (CUDA_VISIBLE_DEVICES=GPU-...) is random but not a secret.
_UUID = re.compile(
    r"(?:[A-Za-z]{2,8}-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def _entropy(text: str) -> float:
    """Shannon entropy, bits per character."""
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def _looks_like_token(value: str) -> bool:
    v = value.strip()
    if _UUID.fullmatch(v):
        return False
    if _HEX_TOKEN.fullmatch(v):
        return _entropy(v) >= 3.0
    if not _OPAQUE_TOKEN.fullmatch(v) or v.startswith(("/", "~", ".")) or "/." in v or "//" in v:
        return False  # paths and path-like values are not tokens
    classes = sum(bool(re.search(p, v)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    return classes >= 3 and _entropy(v) >= 4.0


def is_secret_value(value: str) -> bool:
    return any(p.search(value) for p in _SECRET_VALUE_PATTERNS) or _looks_like_token(value)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    for p in patterns:
        if p.endswith("*") and name.startswith(p[:-1]):
            return True
        if name == p:
            return True
    return False


def is_allowed_name(name: str, extra: Iterable[str] = ()) -> bool:
    if name in NEVER_PASSED or name.startswith(_NEVER_PREFIXES):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES) or _matches(name, extra)


def check_allow_list(names: Iterable[str]) -> list[str]:
    """Problems with a user's `env_allow` entries (a name, or a prefix ending in `*`)."""
    problems: list[str] = []
    for n in names:
        if not _NAME.fullmatch(n) or n == "*":
            problems.append(f"{n!r} is not a variable name (or a prefix ending in '*')")
        elif n in NEVER_PASSED or n.startswith(_NEVER_PREFIXES):
            problems.append(f"{n} is never passed into the sandbox (it changes how host programs start)")
    return problems


@dataclass(frozen=True)
class ScrubbedEnvironment:
    env: dict[str, str]
    not_allowed: tuple[str, ...]  # names not on the allow list (sorted)
    secret_values: tuple[str, ...]  # allowed names whose value looked like a credential (sorted)

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(sorted(self.not_allowed + self.secret_values))


def filter_environment(env: Mapping[str, str], allow: Iterable[str] = ()) -> ScrubbedEnvironment:
    extra = tuple(allow)
    clean: dict[str, str] = {}
    not_allowed: list[str] = []
    secret: list[str] = []
    for name, value in env.items():
        if not is_allowed_name(name, extra):
            not_allowed.append(name)
        elif is_secret_value(value):
            secret.append(name)
        else:
            clean[name] = value
    return ScrubbedEnvironment(clean, tuple(sorted(not_allowed)), tuple(sorted(secret)))


def scrub_environment(env: Mapping[str, str], allow: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """Return (clean environment, sorted names removed)."""
    result = filter_environment(env, allow)
    return result.env, list(result.removed)
