"""The environment a sandboxed command gets: the caller's, minus anything that looks like a secret."""

from __future__ import annotations

import re
from collections.abc import Mapping

# A variable whose NAME contains one of these (case-insensitive) is dropped.
SECRET_NAME_PARTS = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASS",  # PASSWORD, PASSWD, PASSPHRASE
    "CREDENTIAL",
    "AUTH",  # also SSH_AUTH_SOCK: the agent socket is a key by proxy
    "COOKIE",
    "SESSION",
    "PRIVATE",
    "SIGNATURE",
)
# A variable whose VALUE looks like one of these is dropped whatever its name.
_SECRET_VALUE_PATTERNS = (
    re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.IGNORECASE),  # URL with user:password@
    re.compile(
        r"^(?:sk-|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|xox[abpr]-|AKIA|ASIA|hf_|npm_)[A-Za-z0-9_\-]{8,}"
    ),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
)


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def is_secret_value(value: str) -> bool:
    return any(p.search(value) for p in _SECRET_VALUE_PATTERNS)


def scrub_environment(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Return (clean environment, sorted names removed)."""
    clean: dict[str, str] = {}
    removed: list[str] = []
    for name, value in env.items():
        if is_secret_name(name) or is_secret_value(value):
            removed.append(name)
        else:
            clean[name] = value
    return clean, sorted(removed)
