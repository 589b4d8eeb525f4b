"""The megakernel's tensor-core loops in SASS, and their local-memory traffic.

On 2026-11-29 the GEMV's weight-stream loop spilling (STL/LDL around every HMMA: a spill store
waits for its load, so the loads in flight collapse and every GEMV task took twice as long). Local
memory inside a loop is invisible in the source and in the tests, so this reads the compiled object:
`cuobjdump -sass` (needs nvdisasm next to it; `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`
gives both), every backward branch is a loop, and each loop that holds HMMA is counted (instructions,
HMMA, LDL/STL, LDS, LDG) and named after the device function it lies in (`cuobjdump -elf` symbols).

The *weight-stream* loops are those of the GEMV core (`gemv_*`, out of line on purpose
since 2026-11-29): batches of 16-byte weight loads, each feeding one mma. They must have no local-memory access at
all, and they must exist (an inlined GEMV core is a regression of its own). `mkcode kernels loops`
prints the table and fails otherwise; CI runs the same check on the object it compiles. The
attention's round loop does reload some values from local memory (2026-11-29: ~56 accesses at
d = 128), which the table shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mkcode.backend.megakernel.code_size import (
    CodeSizeError,
    require_cuobjdump,
    run_cuobjdump,
    short_name,
    symtab_functions,
)


@dataclass(frozen=True)
class Loop:
    start: int  # address of the loop head (the backward branch's target)
    end: int  # address of the backward branch
    function: str  # the device function holding it ("?" when no symbol covers it)
    instructions: int
    hmma: int
    local: int  # LDL + STL
    lds: int
    ldg: int

    @property
    def weight_stream(self) -> bool:
        """A loop of the GEMV core (out of line since 2026-11-29: `gemv_*`), the weight stream."""
        return self.function.startswith("gemv")


_INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRA = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


def parse_functions(elf_text: str, kernel: str | None = None) -> list[tuple[int, int, str]]:
    """(start, end, short name) of every non-entry FUNC symbol of `cuobjdump -elf` output (the
    entry spans the whole section; code outside every other symbol is the entry's own). kernel: only
    that entry's functions (each kernel of an object has its own copies, `$entry$function`, in its
    own section at overlapping addresses)."""
    return sorted(
        (start, start + size, short_name(sym))
        for start, size, binding, sym in symtab_functions(elf_text)
        if binding != "GLOBAL" and (kernel is None or sym.startswith(f"${kernel}$"))
    )


def default_kernel(elf_text: str) -> str:
    """The object's step kernel: its only entry, or, when the step kernel is instantiated more than
    once (`template <bool>`: a variant measured against the default, as the removed head
    variant was), `mk_step_kernel<false>`."""
    entries = [sym for _, _, binding, sym in symtab_functions(elf_text) if binding == "GLOBAL"]
    if len(entries) == 1:
        return entries[0]
    for sym in entries:
        if "mk_step_kernelILb0E" in sym:
            return sym
    raise CodeSizeError(f"no default step kernel among the object's entries {entries}")


def kernel_sass(sass_text: str, kernel: str) -> str:
    """The part of `cuobjdump -sass` output that lists `kernel` (one `Function : NAME` block)."""
    blocks = re.split(r"^\s*Function : (\S+)\s*$", sass_text, flags=re.M)
    for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
        if name == kernel:
            return body
    raise CodeSizeError(f"no SASS listing of {kernel} in the object")


def object_sass(obj: Path, cuobjdump: str | None = None) -> tuple[str, list[tuple[int, int, str]]]:
    """The default step kernel's SASS and its device functions' address spans, from a compiled
    kernel object."""
    tool = require_cuobjdump(cuobjdump)
    elf = run_cuobjdump(tool, "-elf", obj)
    kernel = default_kernel(elf)
    return kernel_sass(run_cuobjdump(tool, "-sass", obj), kernel), parse_functions(elf, kernel)


def parse_loops(sass_text: str, functions: list[tuple[int, int, str]] | None = None) -> list[Loop]:
    """Every loop (a backward branch) of `cuobjdump -sass` output that holds HMMA, in address order.
    Nested loops are reported each (an outer loop's counts include its inner loops')."""
    ins: list[tuple[int, str]] = []
    for line in sass_text.splitlines():
        m = _INS.match(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    at = {a: i for i, (a, _) in enumerate(ins)}

    def owner(addr: int) -> str:
        for lo, hi, name in functions or ():
            if lo <= addr < hi:
                return name
        return "mk_step_kernel" if functions else "?"

    loops = []
    for i, (addr, text) in enumerate(ins):
        m = _BRA.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr or target not in at:
            continue
        body = [t.split()[0] if not t.startswith("@") else t.split()[1] for _, t in ins[at[target] : i + 1]]
        hmma = sum(op.startswith("HMMA") for op in body)
        if not hmma:
            continue
        loops.append(
            Loop(
                start=target,
                end=addr,
                function=owner(target),
                instructions=len(body),
                hmma=hmma,
                local=sum(op.startswith(("LDL", "STL")) for op in body),
                lds=sum(op.startswith("LDS") for op in body),
                ldg=sum(op.startswith("LDG") for op in body),
            )
        )
    return sorted(loops, key=lambda lp: lp.start)


def mma_loops(obj: Path, cuobjdump: str | None = None) -> list[Loop]:
    """The loops holding HMMA in the compiled kernel object, named by device function."""
    loops = parse_loops(*object_sass(obj, cuobjdump))
    if not loops:
        raise CodeSizeError(f"no loop with HMMA in {obj} (is nvdisasm next to cuobjdump?)")
    return loops


def weight_stream_problems(loops: list[Loop]) -> list[str]:
    """What is wrong with the GEMV core's loops: none found, or local-memory traffic in one."""
    streams = [lp for lp in loops if lp.weight_stream]
    if not streams:
        return ["no loop of the GEMV core (gemv_*) holds HMMA: was it inlined?"]
    return [
        f"{lp.function} loop {lp.start:#x}-{lp.end:#x}: {lp.local} local-memory accesses (LDL/STL) "
        f"among {lp.hmma} HMMA"
        for lp in streams
        if lp.local
    ]


def opcode(text: str) -> str:
    """The opcode of one SASS instruction (a guard predicate such as `@!P0` skipped)."""
    parts = text.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


def own_opcodes(sass_text: str, functions: list[tuple[int, int, str]]) -> list[str]:
    """The opcodes, in address order, of the step kernel's own code: its instructions outside every
    device function's span (the dispatch loop and the ops inlined into it). A change to an
    out-of-line op can still change this code: ptxas fits each call's convention to its callee
    (2026-11-30: the sampler's registers reached it through op_sample_row)."""
    out = []
    for line in sass_text.splitlines():
        m = _INS.match(line)
        if m and not any(lo <= int(m.group(1), 16) < hi for lo, hi, _ in functions):
            out.append(opcode(m.group(2)))
    return out


def opcode_changes(a: list[str], b: list[str]) -> int:
    """How many opcodes of b differ from a (inserted, deleted or replaced; difflib's matching)."""
    import difflib

    changed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            changed += max(i2 - i1, j2 - j1)
    return changed
