"""Python mirror of `csrc/mk_abi.h`, made by parsing the header (the one source of truth).

Enum members (`NAME = <int>,`) and `#define NAME <int>` become module constants here, and the
X-macro lists of kernel parameters become ordered name lists, so Python and CUDA cannot drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "csrc"
HEADER = CSRC / "mk_abi.h"

_ENUM_RE = re.compile(r"enum\s+(\w+)\s*\{(.*?)\};", re.S)
_MEMBER_RE = re.compile(r"^\s*(MK_\w+)\s*=\s*(-?\d+)\s*,", re.M)
_DEFINE_RE = re.compile(r"^#define\s+(MK_\w+)\s+(-?\d+)\b", re.M)
_XMACRO_RE = re.compile(r"#define\s+(MK_PARAM_\w+)\(X\)((?:.*\\\n)*.*)")
_X_RE = re.compile(r"X\((\w+)\)")


@dataclass(frozen=True)
class Abi:
    constants: dict[str, int]
    enums: dict[str, dict[str, int]]
    param_ptrs: tuple[str, ...]
    param_ints: tuple[str, ...]
    param_floats: tuple[str, ...]

    def opcodes(self) -> dict[str, int]:
        return {k.removeprefix("MK_OP_"): v for k, v in self.enums["MkOpcode"].items() if k != "MK_OP_COUNT"}


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def parse_header(text: str) -> Abi:
    """Parse the ABI header's text (exposed for tests)."""
    raw = text
    text = _strip_comments(text)
    enums: dict[str, dict[str, int]] = {}
    constants: dict[str, int] = {}
    for name, body in _ENUM_RE.findall(text):
        members = {m: int(v) for m, v in _MEMBER_RE.findall(body)}
        enums[name] = members
        for m, v in members.items():
            if m in constants:
                raise ValueError(f"{HEADER.name}: {m} defined twice")
            constants[m] = v
    for m, v in _DEFINE_RE.findall(text):
        if m in constants:
            raise ValueError(f"{HEADER.name}: {m} defined twice")
        constants[m] = int(v)
    lists: dict[str, tuple[str, ...]] = {}
    for name, body in _XMACRO_RE.findall(_strip_comments(raw.replace("\\\n", "\\\n"))):
        lists[name] = tuple(_X_RE.findall(body))
    for need in ("MK_PARAM_PTRS", "MK_PARAM_INTS", "MK_PARAM_FLOATS"):
        if not lists.get(need):
            raise ValueError(f"{HEADER.name}: X-macro {need} missing or empty")
    return Abi(
        constants=constants,
        enums=enums,
        param_ptrs=lists["MK_PARAM_PTRS"],
        param_ints=lists["MK_PARAM_INTS"],
        param_floats=lists["MK_PARAM_FLOATS"],
    )


@cache
def load() -> Abi:
    return parse_header(HEADER.read_text())


_ABI = load()
globals().update(_ABI.constants)  # MK_OP_QKV, MK_F_LAYER, MK_DESC_WORDS, ... as module constants

OPCODES: dict[str, int] = _ABI.opcodes()
OPNAMES: dict[int, str] = {v: k for k, v in OPCODES.items()}
PARAM_PTRS = _ABI.param_ptrs
PARAM_INTS = _ABI.param_ints
PARAM_FLOATS = _ABI.param_floats


def __getattr__(name: str) -> int:  # typed access for linters: abi.MK_OP_QKV etc.
    try:
        return _ABI.constants[name]
    except KeyError:
        raise AttributeError(name) from None
