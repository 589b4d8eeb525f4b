"""`mkcode kernels`: build and inspect the decode megakernel extension.

    mkcode kernels build [--compile-only] [--force] [--verbose]
    mkcode kernels info
    mkcode kernels sizes
    mkcode kernels loops
    mkcode kernels own-code OTHER.o

Builds are cached under ~/.cache/mkcode/kernels (or $MKCODE_KERNEL_CACHE) by a hash of the CUDA
sources, flags, nvcc and Python versions. `--compile-only` compiles to an object file (no GPU
needed, no link): it is the CI check that `csrc/` compiles.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "kernels",
        help="build or inspect the CUDA decode megakernel",
        description="Build (nvcc, sm_90a) or inspect the decode megakernel extension.",
    )
    parser.set_defaults(func=lambda args: _usage(parser))
    sub = parser.add_subparsers(dest="kernels_command", metavar="SUBCOMMAND")
    b = sub.add_parser("build", help="compile the extension (cached by a hash of sources and flags)")
    b.add_argument(
        "--compile-only", action="store_true", help="compile to an object file only (CI: no GPU, no link)"
    )
    b.add_argument("--force", action="store_true", help="rebuild even if the cache has this build")
    b.add_argument("--verbose", "-v", action="store_true", help="print the nvcc command and its output")
    b.set_defaults(func=run_build)
    i = sub.add_parser("info", help="show the toolchain, the cache and whether the extension is built")
    i.set_defaults(func=run_info)
    z = sub.add_parser(
        "sizes", help="SASS bytes of each device function of the kernel (compiles it if needed; no GPU)"
    )
    z.set_defaults(func=run_sizes)
    lo = sub.add_parser(
        "loops",
        help="the kernel's tensor-core loops and their local-memory traffic; fails if the GEMV's spills "
        "(compiles it if needed; no GPU)",
    )
    lo.set_defaults(func=run_loops)
    oc = sub.add_parser(
        "own-code",
        help="compare the step kernel's own code (outside its device functions) with another object's, "
        "e.g. main's from backend/megakernel/ab_tree.sh (compiles this one if needed; no GPU)",
    )
    oc.add_argument("other", type=Path, help="the other kernel object (mk_kernel.o)")
    oc.set_defaults(func=run_own_code)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_build(args: argparse.Namespace) -> int:
    from mkcode.backend.megakernel.build import BuildError, build

    try:
        res = build(compile_only=args.compile_only, force=args.force, verbose=args.verbose)
    except BuildError as e:
        print(f"mkcode kernels build: {e}", file=sys.stderr)
        return 1
    what = "object" if args.compile_only else "extension"
    if res.cached:
        print(f"{what} up to date: {res.path}")
    else:
        print(f"built {what} in {res.seconds:.1f} s: {res.path}")
        if args.verbose:
            print(res.log)
    return 0


def _inspect_object(command: str, inspect: Callable[[Path], T]) -> tuple[Path, T] | None:
    """Build (or find cached) the kernel object and run `inspect` on it; None after printing why
    not (`mkcode kernels COMMAND: ...`)."""
    from mkcode.backend.megakernel.build import BuildError, build
    from mkcode.backend.megakernel.code_size import CodeSizeError

    try:
        obj = build(compile_only=True).path
        return obj, inspect(obj)
    except (BuildError, CodeSizeError) as e:
        print(f"mkcode kernels {command}: {e}", file=sys.stderr)
        return None


def run_sizes(args: argparse.Namespace) -> int:
    from mkcode.backend.megakernel.code_size import function_sizes

    got = _inspect_object("sizes", function_sizes)
    if got is None:
        return 1
    obj, sizes = got
    total = sum(f.size for f in sizes)
    print(f"{obj}: {total / 1024:.1f} KB of SASS in {len(sizes)} functions")
    for f in sizes:
        print(f"{f.size / 1024:8.1f} KB  {f.name}")
    return 0


def run_loops(args: argparse.Namespace) -> int:
    from mkcode.backend.megakernel.sass_loops import mma_loops, weight_stream_problems

    got = _inspect_object("loops", mma_loops)
    if got is None:
        return 1
    obj, loops = got
    print(f"{obj}: loops holding HMMA")
    print(f"{'function':<24} {'loop':>19} {'instr':>6} {'HMMA':>5} {'LDL/STL':>8} {'LDS':>5} {'LDG':>5}")
    for lp in loops:
        span = f"{lp.start:#x}-{lp.end:#x}"
        print(
            f"{lp.function:<24} {span:>19} {lp.instructions:>6} {lp.hmma:>5} {lp.local:>8} {lp.lds:>5} {lp.ldg:>5}"
        )
    problems = weight_stream_problems(loops)
    for p in problems:
        print(f"mkcode kernels loops: {p}", file=sys.stderr)
    return 1 if problems else 0


def run_own_code(args: argparse.Namespace) -> int:
    """A change to an out-of-line op can change the step kernel's dispatch code (ptxas fits each call's
    convention to its callee), and with it every task's timing: the count of opcodes that differ."""
    from mkcode.backend.megakernel.code_size import CodeSizeError
    from mkcode.backend.megakernel.sass_loops import object_sass, opcode_changes, own_opcodes

    got = _inspect_object("own-code", lambda obj: own_opcodes(*object_sass(obj)))
    if got is None:
        return 1
    obj, mine = got
    try:
        other = own_opcodes(*object_sass(args.other))
    except (CodeSizeError, OSError) as e:
        print(f"mkcode kernels own-code: {e}", file=sys.stderr)
        return 1
    changed = opcode_changes(other, mine)
    print(f"{args.other}: {len(other)} instructions of the step kernel's own code")
    print(f"{obj}: {len(mine)}; {changed} differ")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from mkcode.backend.megakernel import build as b

    nvcc = b.find_nvcc()
    print(f"nvcc:            {nvcc or 'not found'}")
    if nvcc:
        print(f"                 {b.nvcc_version(nvcc).splitlines()[-1]}")
    print(f"pybind11:        {b.pybind11_include() or 'not installed'}")
    print(f"Python headers:  {b.python_include() or 'missing'}")
    print(f"cache:           {b.cache_root()}")
    art = b.cached_artifact()
    print(f"extension:       {art or 'not built'}")
    missing = b.missing_requirements()
    for m in missing:
        print(f"missing:         {m}")
    return 0 if not missing else 1
