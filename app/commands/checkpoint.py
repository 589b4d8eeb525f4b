"""`mkcode checkpoint`: write synthetic checkpoints and inspect checkpoint directories.

    mkcode checkpoint synth --size tiny|small --out DIR [--seed N] [--experts fused|per-expert]
    mkcode checkpoint inspect DIR [--tensors]

Heavy imports (torch, safetensors) happen inside the handlers, so `mkcode --help` stays light.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

SIZES = ("tiny", "small")
EXPERT_CHOICES = {"fused": "fused", "per-expert": "per_expert"}


def register(subparsers: Any) -> None:
    """Add the `checkpoint` command and its `synth` / `inspect` subcommands."""
    parser = subparsers.add_parser(
        "checkpoint",
        help="write synthetic checkpoints, inspect checkpoint directories",
        description="Write synthetic North Mini Code checkpoints, or inspect a checkpoint directory.",
    )
    parser.set_defaults(func=lambda args: _usage(parser))
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="SUBCOMMAND")

    synth = sub.add_parser(
        "synth",
        help="write a synthetic HF checkpoint (random weights, synthetic tokenizer)",
        description="Write a complete synthetic Hugging Face checkpoint directory.",
    )
    synth.add_argument("--size", choices=SIZES, required=True, help="geometry preset")
    synth.add_argument("--out", type=Path, required=True, help="output directory")
    synth.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    synth.add_argument(
        "--experts",
        choices=list(EXPERT_CHOICES),
        default="fused",
        help="expert tensors fused (transformers' parameters) or per expert (save_pretrained's files)",
    )
    synth.add_argument("--shard-mb", type=float, default=None, help="maximum shard size in MB")
    synth.set_defaults(func=run_synth)

    demo = sub.add_parser(
        "demo",
        help="the small demo checkpoint that ships with mkcode (real tool calls); --train retrains one",
        description="Same as `mkcode demo-model`: the small North Mini Code checkpoint that ships inside "
        "the package (trained once on generated tool-use dialogues, checksummed, verified on every use; "
        "nothing is trained at run time). Prints its path or copies it to --out; --evaluate runs the "
        "held-out request set; --train --out DIR [--device cuda] retrains one with the fixed-seed script.",
    )
    from mkcode.app.commands.demo import add_arguments as add_demo_arguments

    add_demo_arguments(demo)

    inspect = sub.add_parser(
        "inspect",
        help="summarise a checkpoint directory: config, parameter counts, tensors, bytes",
        description="Validate and summarise a checkpoint directory without loading its tensors.",
    )
    inspect.add_argument("dir", type=Path, help="checkpoint directory")
    inspect.add_argument("--tensors", action="store_true", help="list every stored tensor")
    inspect.set_defaults(func=run_inspect)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_synth(args: argparse.Namespace) -> int:
    import time

    from mkcode.backend.checkpoint.synth import synth_checkpoint

    t0 = time.perf_counter()
    shard_bytes = int(args.shard_mb * 1e6) if args.shard_mb else None
    out = synth_checkpoint(
        args.size, args.out, args.seed, experts_layout=EXPERT_CHOICES[args.experts], shard_bytes=shard_bytes
    )
    total = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {args.size} checkpoint to {out} ({total / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from mkcode.backend.checkpoint.errors import CheckpointError
    from mkcode.backend.checkpoint.loader import plan_checkpoint
    from mkcode.backend.checkpoint.stats import param_counts

    console = Console()
    try:
        plan, used_index = plan_checkpoint(args.dir)
    except CheckpointError as e:
        print(f"mkcode checkpoint inspect: {e}", file=sys.stderr)
        return 1
    cfg = plan.config
    counts = param_counts(cfg)
    full = [i for i in range(cfg.num_hidden_layers) if not cfg.is_sliding(i)]
    rope = [i for i in range(cfg.num_hidden_layers) if cfg.uses_rope(i)]

    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    rows = [
        ("checkpoint", str(args.dir)),
        ("model", f"{cfg.extra.get('model_type', 'cohere2_moe')}"),
        ("layers", f"{cfg.num_hidden_layers} (dense: {cfg.dense_layers}; full attention: {full})"),
        ("RoPE layers", f"{_ranges(rope)} (theta {cfg.rope_theta:g})"),
        ("hidden", str(cfg.hidden_size)),
        (
            "attention",
            f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} kv heads × {cfg.head_dim}"
            f" (Q width {cfg.q_width}); sliding window {cfg.sliding_window}",
        ),
        (
            "experts",
            f"{cfg.num_experts} routed, top-{cfg.num_experts_per_tok} ({cfg.expert_selection_fn}),"
            f" intermediate {cfg.intermediate_size}; dense intermediate {cfg.prefix_dense_intermediate_size}",
        ),
        (
            "vocab",
            f"{cfg.vocab_size} (tied embeddings: {cfg.tie_word_embeddings}; logit_scale {cfg.logit_scale:g})",
        ),
        ("eos / bos / pad", f"{list(cfg.eos_token_ids)} / {cfg.bos_token_id} / {cfg.pad_token_id}"),
        ("parameters", f"{_n(counts.total)} total, {_n(counts.active)} active per token (with LM head)"),
        ("files", f"{len(plan.files)} shard(s){' via index' if used_index else ''}"),
        ("experts stored", plan.expert_layout),
        ("tensors", f"{len(plan.placements)} stored"),
        (
            "bytes",
            f"{plan.nbytes / 1e9:.3f} GB ("
            + ", ".join(f"{k}: {v / 1e9:.3f} GB" for k, v in sorted(plan.storage_dtypes().items()))
            + ")",
        ),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    console.print(summary)

    if args.tensors:  # plain lines, one a tensor, so the list greps and pipes well
        width = max(len(p.source.name) for p in plan.placements)
        for p in plan.placements:
            t = p.source
            print(
                f"{t.name:<{width}}  {t.dtype:<4}  {t.nbytes / 1e6:>10.3f} MB  {t.file.name}  {list(t.shape)}"
            )
    return 0


def _n(x: int) -> str:
    return f"{x / 1e9:.2f}B" if x >= 1e9 else f"{x / 1e6:.2f}M"


def _ranges(xs: list[int]) -> str:
    return str(xs) if len(xs) <= 12 else f"{len(xs)} layers"
