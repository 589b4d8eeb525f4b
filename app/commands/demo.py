"""`mkcode demo-model`: train (or fetch from the cache) the tiny demo checkpoint that speaks cmd4 tool calls.

    mkcode demo-model                 # train once, cache, print the directory
    mkcode demo-model --out DIR       # and copy it to DIR (a normal HF checkpoint directory)
    mkcode generate --model "$(mkcode demo-model)" ...

Torch is imported only inside the handler.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo-model",
        help="train the tiny demo checkpoint (cmd4 tool calling, CPU, ~2-3.5 min) and print its path",
        description=(
            "Train a tiny North Mini Code checkpoint on generated tool-use dialogues (list, read, grep, "
            "edit, run, answer) with a fixed seed, on the CPU. The result is cached under "
            "$XDG_CACHE_HOME/mkcode/demo-model/<hash of the trainer>, so later calls are instant."
        ),
    )
    add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo trainer's flags; also used by `mkcode checkpoint demo`."""
    p.add_argument("--out", type=Path, help="also copy the checkpoint to this directory")
    p.add_argument("--steps", type=int, help="training steps (default: the trainer's; changes the cache key)")
    p.add_argument("--seed", type=int, help="training seed (default 0; changes the cache key)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from mkcode.backend.demo import DemoTrainConfig, ensure_demo_model

    config = DemoTrainConfig()
    if args.steps is not None:
        config = replace(config, steps=args.steps)
    if args.seed is not None:
        config = replace(config, seed=args.seed)

    def progress(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    path = ensure_demo_model(config, progress)
    report_file = path / "demo_report.json"
    if report_file.exists() and not args.quiet:
        report = json.loads(report_file.read_text())
        ev = report.get("eval", {})
        print(
            f"demo model: trained in {report['train_seconds']}s ({report['steps']} steps); fresh dialogues "
            f"with a valid tool call: {ev.get('valid', '?')}/{ev.get('total', '?')}; ready in {time.monotonic() - t0:.1f}s",
            file=sys.stderr,
        )
    if args.out is not None:
        if args.out.exists():
            if not args.force:
                print(f"error: {args.out} exists (use --force to overwrite)", file=sys.stderr)
                return 2
            shutil.rmtree(args.out)
        shutil.copytree(path, args.out)
        path = args.out
    print(path)
    return 0
