"""Text helpers shared by the tools: safe display of non-UTF-8 names and content, truncation."""

from __future__ import annotations

import os
import re

# Sample size used to decide whether a file is binary.
BINARY_SNIFF_BYTES = 8192

# Control bytes that do not occur in text (tab, LF, VT, FF, CR, ESC and backspace are allowed).
_TEXT_CONTROL_OK = {0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1B}


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    # U+DC80..U+DCFF are raw bytes 0x80..0xFF smuggled by surrogateescape.
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def clean_text(s: str) -> str:
    """Replace lone surrogates with `\\xNN` / `\\uNNNN` escapes so the text is valid UTF-8."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape_surrogate, s)


def display_path(path: str) -> str:
    """A path as shown to the model: undecodable bytes become `\\xNN`."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


_ESCAPED_BYTE = re.compile(r"\\x([0-9a-fA-F]{2})")


def unescape_display_path(path: str) -> str | None:
    """Inverse of display_path for paths the model copied back, or None if nothing to undo."""
    if not _ESCAPED_BYTE.search(path):
        return None
    raw = _ESCAPED_BYTE.sub(
        lambda m: chr(0xDC00 + int(m.group(1), 16)) if int(m.group(1), 16) >= 0x80 else m.group(0), path
    )
    return raw if raw != path else None


def looks_binary(sample: bytes) -> bool:
    """True for data with a NUL byte or mostly non-text control bytes."""
    if not sample:
        return False
    if b"\x00" in sample:
        return True
    controls = sum(1 for b in sample if b < 0x20 and b not in _TEXT_CONTROL_OK)
    return controls / len(sample) > 0.10


def truncate_middle(text: str, limit: int, what: str = "characters") -> tuple[str, bool]:
    """Keep the head and tail of `text` within `limit` characters, with a marker in between."""
    if len(text) <= limit:
        return text, False
    half = limit // 2
    dropped = len(text) - 2 * half
    marker = f"\n[... {dropped} {what} truncated ...]\n"
    return text[:half] + marker + text[-half:], True
