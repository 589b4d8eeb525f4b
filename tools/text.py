"""Text helpers shared by the tools: safe display of non-UTF-8 names and content, truncation, and
`terminal_safe`, the one sanitiser every front end applies where text reaches a terminal."""

from __future__ import annotations

import os
import re
import unicodedata

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


# -- terminal output --------------------------------------------------------------------------------
#
# Tool output, file contents, diffs and model text are untrusted: an escape sequence in them could set
# the window title, write the clipboard (OSC 52), hide lines (cursor moves, erase, CR), reset the
# terminal, or (with bidi overrides) make the code shown differ from the code run. `terminal_safe`
# keeps newline and tab and shows every other control or invisible format character as a visible
# marker: C0 controls and DEL as their Unicode control pictures (ESC → ␛, CR → ␍, BEL → ␇), anything
# else as `<U+XXXX>`. The data the model and the tools see is never changed: only what is printed.

# Format characters (category Cf, Unicode 14/15: bidi embeddings, overrides and isolates, zero-width
# characters, BOM, tags, interlinear annotations ...), line and paragraph separators, Hangul fillers
# (blank letters used for invisible identifiers), surrogates, C0 (but tab and newline), DEL and C1.
_UNSAFE_CLASS = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f"
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\u3164"
    "\ud800-\udfff\ufeff\ufff9-\ufffb\uffa0"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
_JOINERS = "\u200c\u200d"  # ZWNJ, ZWJ: needed inside emoji sequences and Indic/Arabic-script words
_TERMINAL_UNSAFE = re.compile(
    "(?P<crlf>\r\n)"
    # An emoji tag sequence (the flags of England, Scotland, Wales): black flag, tags, cancel tag.
    "|(?P<flag>\U0001f3f4[\U000e0020-\U000e007e]{1,30}\U000e007f)"
    f"|(?P<joiner>[{_JOINERS}])"
    f"|(?P<unsafe>[{_UNSAFE_CLASS}])"
)
_JSON_UNSAFE = re.compile(f"[{_UNSAFE_CLASS}]")
_FLAG = "\U0001f3f4"
_MAX_FLAG_TAGS = 30
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})


def escape_char(ch: str) -> str:
    """The visible marker for one unsafe character: `␛` for C0 controls and DEL, else `<U+XXXX>`."""
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    return f"<U+{code:04X}>"


def _joinable(ch: str) -> bool:
    """A neighbour that makes ZWJ / ZWNJ legitimate: a visible non-ASCII character (emoji, a letter
    or mark of a script that uses joiners). Between ASCII letters a joiner only hides something."""
    return ch > "\x7f" and unicodedata.category(ch) not in _INVISIBLE_CATEGORIES


def _sanitise(text: str, start: int, end: int) -> tuple[str, list[tuple[int, int]]]:
    """`text[start:end]` made terminal-safe (characters outside the range are context only), and
    the (start, end) offsets of the markers in the result."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    length = 0
    pos = start
    for m in _TERMINAL_UNSAFE.finditer(text, start, end):
        if m.start() > pos:
            out.append(text[pos : m.start()])
            length += m.start() - pos
        pos = m.end()
        if m.lastgroup == "crlf":
            piece, marked = "\n", False
        elif m.lastgroup == "flag":
            piece, marked = m.group(), False
        elif m.lastgroup == "joiner":
            i = m.start()
            before = text[i - 1] if i > 0 else ""
            after = text[i + 1] if i + 1 < len(text) else ""
            marked = not (before and after and _joinable(before) and _joinable(after))
            piece = escape_char(m.group()) if marked else m.group()
        else:
            piece, marked = escape_char(m.group()), True
        if marked:
            spans.append((length, length + len(piece)))
        out.append(piece)
        length += len(piece)
    if end > pos:
        out.append(text[pos:end])
    return "".join(out), spans


def terminal_safe_marked(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`terminal_safe(text)` and the (start, end) offsets of its escape markers, for styling them."""
    return _sanitise(text, 0, len(text))


def terminal_safe(text: str) -> str:
    """`text` with nothing a terminal would act on: newline and tab are kept, CR LF becomes LF, and
    every other control character (C0, DEL, C1: ESC, BEL, backspace, a lone CR ...) and every
    invisible format character (bidi overrides and isolates, zero-width characters, BOM, tags) is
    shown as a visible marker. Ordinary text (any script, emoji, CJK) is unchanged; idempotent."""
    if text.isascii() and text.isprintable():
        return text
    return _sanitise(text, 0, len(text))[0]


class TerminalStream:
    """`terminal_safe` for text that arrives in pieces (streamed model output): the result of all
    `feed()`s and the final `flush()` equals `terminal_safe` of the whole. A piece that depends on
    what follows (a trailing CR, a joiner, an unfinished flag tag sequence) is held back until the
    next piece says what it is."""

    def __init__(self) -> None:
        self._before = ""  # the last character written out (context for a joiner)
        self._held = ""

    def feed(self, chunk: str) -> str:
        return self.feed_marked(chunk)[0]

    def flush(self) -> str:
        return self.flush_marked()[0]

    def feed_marked(self, chunk: str) -> tuple[str, list[tuple[int, int]]]:
        """The safe text `chunk` completes, and the offsets of its markers (see terminal_safe_marked)."""
        buf = self._before + self._held + chunk
        first = len(self._before)
        cut = _stable_end(buf, first)
        if cut > first:
            self._before = buf[cut - 1]
        self._held = buf[cut:]
        return _sanitise(buf, first, cut)

    def flush_marked(self) -> tuple[str, list[tuple[int, int]]]:
        """Everything held back, the stream being complete."""
        buf = self._before + self._held
        first = len(self._before)
        if self._held:
            self._before = self._held[-1]
        self._held = ""
        return _sanitise(buf, first, len(buf))


def _stable_end(buf: str, first: int) -> int:
    """Where `buf[first:]` can be cut so the part before sanitises the same whatever comes next."""
    cut = len(buf)
    flag = buf.rfind(_FLAG, first)
    if flag >= 0:
        tags = buf[flag + 1 :]
        if len(tags) <= _MAX_FLAG_TAGS and all("\U000e0020" <= c <= "\U000e007e" for c in tags):
            cut = flag  # maybe an unfinished tag sequence
    if cut > first and buf[cut - 1] in "\r" + _JOINERS:
        cut -= 1
    return cut


def json_terminal_safe(json_text: str) -> str:
    """JSON text (from `json.dumps(..., ensure_ascii=False)`) with every character `terminal_safe`
    would mark written as a `\\uXXXX` escape: the same JSON value, but no C1 control, DEL, bidi or
    other format character reaches a terminal raw (json.dumps already escapes C0 controls)."""

    def escape(m: re.Match[str]) -> str:
        code = ord(m.group())
        if code <= 0xFFFF:
            return f"\\u{code:04x}"
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"

    return _JSON_UNSAFE.sub(escape, json_text)
