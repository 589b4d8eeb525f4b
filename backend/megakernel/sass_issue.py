"""How many loads a device function issues before it first waits on one, read from SASS.

An op on the layer's chain whose loads are all independent (ADD_NORM: the residual and every
partial of its row) should issue them all before its first arithmetic on any: then they cost one L2
round trip together. Session 9 found each load in its own branch, consumed before the next was
issued (13 round trips in a row); session 11 found the compiler starting the adds after 12 of 17
loads. Neither shows in a test's numbers, so this reads the compiled object (`cuobjdump -sass` and
`-elf`, as sass_loops does): in the function's code, in address order, the loads of a kind that
come before the first instruction of another kind. `opcodes_in` counts a function's opcodes (the
fused down slice's sums must be fire-and-forget REDG, not generic ATOM plus compare-and-swap loops,
which is what atomicAdd on a float pointer not known to be global compiled to; session 12).
"""

from __future__ import annotations

from pathlib import Path

from mkcode.backend.megakernel.code_size import CodeSizeError, require_cuobjdump, run_cuobjdump
from mkcode.backend.megakernel.sass_loops import _INS, parse_functions


def _opcode(text: str) -> str:
    """The opcode of one SASS instruction (a guard predicate such as `@!P0` skipped)."""
    parts = text.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


def loads_before_first(
    sass_text: str, functions: list[tuple[int, int, str]], function: str, load: str, use: str
) -> int:
    """Instructions whose opcode starts with `load` that lie before the first whose opcode starts
    with `use`, in `function`'s code (all of them when it has no `use`). A clear error when the
    function is not in the symbols or holds no such load."""
    spans = [(lo, hi) for lo, hi, name in functions if name == function]
    if not spans:
        raise CodeSizeError(f"no device function {function!r} in the object's symbols")
    lo, hi = spans[0]
    n = 0
    seen_load = False
    for line in sass_text.splitlines():
        m = _INS.match(line)
        if not m or not lo <= int(m.group(1), 16) < hi:
            continue
        op = _opcode(m.group(2))
        if op.startswith(use):
            break
        if op.startswith(load):
            n += 1
            seen_load = True
    if not seen_load:
        raise CodeSizeError(f"{function}: no {load} before its first {use}")
    return n


def object_loads_before_first(
    obj: Path, function: str, load: str, use: str, cuobjdump: str | None = None
) -> int:
    """loads_before_first on a compiled kernel object."""
    tool = require_cuobjdump(cuobjdump)
    functions = parse_functions(run_cuobjdump(tool, "-elf", obj))
    return loads_before_first(run_cuobjdump(tool, "-sass", obj), functions, function, load, use)


def opcodes_in(sass_text: str, functions: list[tuple[int, int, str]], function: str) -> dict[str, int]:
    """How often each opcode (with its modifiers, e.g. `REDG.E.ADD.F32.FTZ.RN.STRONG.GPU`) occurs in
    `function`'s code. A clear error when the function is not in the symbols."""
    spans = [(lo, hi) for lo, hi, name in functions if name == function]
    if not spans:
        raise CodeSizeError(f"no device function {function!r} in the object's symbols")
    lo, hi = spans[0]
    counts: dict[str, int] = {}
    for line in sass_text.splitlines():
        m = _INS.match(line)
        if m and lo <= int(m.group(1), 16) < hi:
            op = _opcode(m.group(2))
            counts[op] = counts.get(op, 0) + 1
    return counts


def object_opcodes_in(obj: Path, function: str, cuobjdump: str | None = None) -> dict[str, int]:
    """opcodes_in on a compiled kernel object."""
    tool = require_cuobjdump(cuobjdump)
    functions = parse_functions(run_cuobjdump(tool, "-elf", obj))
    return opcodes_in(run_cuobjdump(tool, "-sass", obj), functions, function)
