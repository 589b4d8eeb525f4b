"""`mkcode demo-model`: the tiny demo checkpoint that ships with mkcode (cmd4 tool calls, CPU).

    mkcode demo-model                       # verify the shipped checkpoint, print its directory
    mkcode demo-model --out DIR             # and copy it to DIR (a normal HF checkpoint directory)
    mkcode demo-model --evaluate            # run the held-out request set on it, print the rates
    mkcode demo-model --train --out DIR --device cuda   # retrain one from scratch (~3.5 min on one H100; CPU: hours)
    mkcode generate --model "$(mkcode demo-model)" ...

Torch is imported only inside the handler.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo-model",
        help="print the shipped tiny demo checkpoint's path (cmd4 tool calling on the CPU); --train retrains",
        description=(
            "The demo model is a tiny North Mini Code checkpoint trained on generated tool-use dialogues "
            "(list, read, grep, edit, run, answer). It ships inside the package with checksums, verified "
            "on every use. --train retrains one with the project's fixed-seed script (--device cuda or cpu)."
        ),
    )
    add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo model's flags; also used by `mkcode checkpoint demo`."""
    p.add_argument(
        "--out", type=Path, help="copy the checkpoint to this directory (with --train: train into it)"
    )
    p.add_argument("--train", action="store_true", help="train a new checkpoint into --out")
    p.add_argument("--device", default="cpu", help="with --train: cuda or cpu (default cpu; slow)")
    p.add_argument("--steps", type=int, help="with --train: training steps (default: the trainer's)")
    p.add_argument("--seed", type=int, help="with --train: training seed (default 0)")
    p.add_argument("--evaluate", action="store_true", help="run the held-out request set and print the rates")
    p.add_argument(
        "--tool-sets",
        choices=["mkcode", "mixed"],
        help="with --train: the training data's tool vocabularies (default mkcode; mixed adds OpenCode's, "
        "Codex CLI's and random renamings)",
    )
    p.add_argument(
        "--tool-set",
        choices=["mkcode", "opencode", "codex"],
        default="mkcode",
        help="with --evaluate (without --train): offer this client's tools in the held-out requests",
    )
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mkcode.backend.demo import DemoModelError, ensure_demo_model

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    if args.out is not None and args.out.exists():
        if not args.force:
            print(f"error: {args.out} exists (use --force to overwrite)", file=sys.stderr)
            return 2
        shutil.rmtree(args.out)
    if args.train:
        if args.out is None:
            print("error: --train needs --out DIR", file=sys.stderr)
            return 2
        from mkcode.backend.demo.trainer import train_to
        from mkcode.backend.demo.vocabularies import MIXES

        extra = {"tool_sets": MIXES[args.tool_sets]} if args.tool_sets else {}
        return train_to(args.out, args.steps, args.seed, evaluate=args.evaluate, device=args.device, **extra)
    if args.steps is not None or args.seed is not None:
        print("error: --steps and --seed apply to --train", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        path = ensure_demo_model(progress=lambda msg: say(f"demo model: {msg}"))
    except DemoModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    say(f"demo model: ready in {time.monotonic() - t0:.2f}s")
    if args.out is not None:
        shutil.copytree(path, args.out)
        path = args.out
    if args.evaluate:
        from mkcode.backend.demo.evaluate import evaluate_checkpoint

        print(evaluate_checkpoint(path, tool_set=args.tool_set).summary(), file=sys.stderr)
    print(path)
    return 0
