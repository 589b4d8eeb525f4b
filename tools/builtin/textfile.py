"""Loading and encoding file text for the edit tools, byte-exact for non-UTF-8 content.

Text is decoded with 'surrogateescape', so bytes that are not UTF-8 survive an edit unchanged.
"""

from __future__ import annotations

import hashlib

from mkcode.tools.safe_io import read_bytes
from mkcode.tools.text import BINARY_SNIFF_BYTES, looks_binary
from mkcode.tools.workspace import Access, PathError, ResolvedPath, Workspace


def load_text(ws: Workspace, rp: ResolvedPath) -> tuple[bytes, str]:
    data = read_bytes(ws, rp)
    if looks_binary(data[:BINARY_SNIFF_BYTES]):
        raise PathError(f"{ws.display(rp.path)} looks like a binary file; refusing to edit it as text")
    return data, data.decode("utf-8", "surrogateescape")


def encode_text(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape")  # raw bytes we decoded earlier
        except UnicodeEncodeError:
            raise PathError(
                "content contains unpaired surrogate characters that are not valid text"
            ) from None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unchanged_since(ws: Workspace, rp: ResolvedPath, expected: bytes | None) -> None:
    """Raise if the file changed between the preview and the write (None: it did not exist)."""
    try:
        now: bytes | None = read_bytes(ws, ws.resolve(rp.path, Access.WRITE))
    except PathError:
        now = None
    if expected is None:
        changed = now is not None
    else:
        changed = now is None or digest(now) != digest(expected)
    if changed:
        raise PathError(f"{ws.display(rp.path)} changed since the edit was prepared; read it again and retry")
