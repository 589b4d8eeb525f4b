"""Train the demo model: a tiny North Mini Code checkpoint that has learned cmd4 tool calling.

The model has the `tiny` preset's architecture (parallel block, dense layer 0, routed experts, GQA,
sliding and full attention, tied embeddings) in a smaller geometry, trained from the synthetic
initialisation with AdamW on generated dialogues (`dialogues.py`), loss on the assistant's tokens
only, on one CPU thread. With the fixed seed it is deterministic for a given torch build; about
12 minutes on one free core. The result is a normal HF checkpoint directory (config.json, bf16
safetensors + index, tokenizer files with the chat template, `VERSION`, `SHA256SUMS`), loadable
by `build_runtime`.

This is how the checkpoint in `backend/demo/checkpoint/` was made; the app never trains:
`ensure_demo_model()` returns that shipped, checksum-verified copy. To retrain:

    python -m mkcode.backend.demo.trainer --out DIR      # or: mkcode demo-model --train --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]

# Smaller than `tiny` where it costs time and does not matter for learning a format.
DEMO_GEOMETRY: dict[str, Any] = {
    "num_hidden_layers": 4,
    "sliding_window_pattern": 4,  # full attention on layer 0, a 256-token window on layers 1-3
    "sliding_window": 256,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "intermediate_size": 96,
    "prefix_dense_intermediate_size": 256,
    "hidden_size": 128,
    "num_attention_heads": 2,  # Q width 64 != hidden 128; GQA 2:1
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 32768,  # holds 10K-token system prompts (OpenCode, Codex CLI)
}


DEMO_MODEL_VERSION = "2"  # bumped whenever the shipped checkpoint is retrained


@dataclass(frozen=True)
class DemoTrainConfig:
    seed: int = 0
    steps: int = 1200  # ~12 min on one free core
    batch_size: int = 4  # dialogues per step (they share the tool-schema prefix)
    threads: int = 1  # torch CPU threads; one is several times faster per step than two on a 2-core machine
    lr: float = 4e-3
    warmup_steps: int = 15
    weight_decay: float = 0.01
    geometry: dict[str, Any] = field(default_factory=lambda: dict(DEMO_GEOMETRY))
    version: str = DEMO_MODEL_VERSION
    eval_dialogues: int = 8  # fresh dialogues decoded greedily after training (report only)

    def key(self) -> dict[str, Any]:
        """What the trained weights depend on (the evaluation is report-only)."""
        return {k: v for k, v in asdict(self).items() if k not in ("eval_dialogues", "threads")}


def _tool_schemas() -> list[dict[str, Any]]:
    """The schemas of mkcode's built-in tools, as the agent sends them (order included)."""
    from mkcode.tools import ToolRegistry, Workspace

    with tempfile.TemporaryDirectory() as d:
        return ToolRegistry(Workspace(d)).openai_tools()


def ensure_demo_model(progress: Progress | None = None) -> Path:
    """The demo checkpoint that ships with the package, its checksums verified (no training)."""
    from mkcode.backend.demo.shipped import demo_model_version, shipped_demo_model

    path = shipped_demo_model()
    if progress is not None:
        progress(f"version {demo_model_version(path)}, checksums verified")
    return path


@dataclass
class _Example:
    suffix: list[int]
    targets: list[int]  # indices into suffix whose token is a training target (assistant tokens)


def _examples(
    tok: Any, tools: list[dict[str, Any]], prefix: list[int], rng: random.Random, n: int
) -> list[_Example]:
    from mkcode.backend.chat import special_tokens as st
    from mkcode.backend.demo.dialogues import make_dialogue

    chatbot, eot = tok.token_to_id(st.CHATBOT), tok.token_to_id(st.END_OF_TURN)
    out = []
    for _ in range(n):
        ids = tok.apply_chat_template(make_dialogue(rng), tools, add_generation_prompt=False)
        if ids[: len(prefix)] != prefix:
            raise RuntimeError("a dialogue does not start with the tool-schema prefix; the template changed?")
        suffix = ids[len(prefix) :]
        targets, inside = [], False
        for i, t in enumerate(suffix):
            if inside:
                targets.append(i)
                if t == eot:
                    inside = False
            elif t == chatbot:
                inside = True
        out.append(_Example(suffix, targets))
    return out


def _trainable(weights: Any) -> list[Any]:
    params = [weights.embed, weights.final_norm]
    for lw in weights.layers:
        params += [t for t in vars(lw).values() if t is not None]
    for p in params:
        p.requires_grad_(True)
    return params


def train_demo_model(
    out_dir: str | os.PathLike[str], config: DemoTrainConfig | None = None, progress: Progress | None = None
) -> Path:
    """Train and write the demo checkpoint into `out_dir`; returns it. Writes `demo_report.json`
    (loss curve, time, and how many fresh dialogues decode to a valid tool call)."""
    import torch

    config = config or DemoTrainConfig()
    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(out_dir, config, say, t0)
    finally:
        torch.set_num_threads(threads_before)


def _train(out_dir: str | os.PathLike[str], config: DemoTrainConfig, say: Progress, t0: float) -> Path:
    import torch

    from mkcode.backend.chat.template import chat_template
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.checkpoint.synth import synthetic_config, synthetic_tokenizer, synthetic_weights
    from mkcode.backend.demo.forward import PackedBatch, hidden_states, logits_at

    torch.manual_seed(config.seed)
    raw_tok = synthetic_tokenizer(4096, 0)
    tok = ChatTokenizer.from_tokenizer(raw_tok, chat_template())
    cfg = synthetic_config("tiny", raw_tok, config.geometry)
    weights = synthetic_weights(cfg, config.seed)
    params = _trainable(weights)
    tools = _tool_schemas()
    prefix = tok.apply_chat_template([], tools, add_generation_prompt=False)
    rng = random.Random(config.seed)
    opt = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.98), weight_decay=config.weight_decay)

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return config.lr * (step + 1) / config.warmup_steps
        frac = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    losses: list[float] = []
    prefix_t = torch.tensor(prefix)
    for step in range(config.steps):
        batch = _examples(tok, tools, prefix, rng, config.batch_size)
        suffix = torch.tensor([t for ex in batch for t in ex.suffix])
        rows, labels, base = [], [], len(prefix)
        for ex in batch:
            rows += [base + i - 1 for i in ex.targets]  # the position before a target predicts it
            labels += [ex.suffix[i] for i in ex.targets]
            base += len(ex.suffix)
        x = hidden_states(cfg, weights, PackedBatch(prefix_t, suffix, [len(ex.suffix) for ex in batch]))
        logits = logits_at(cfg, weights, x, torch.tensor(rows))
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(round(loss.item(), 4))
        if step % 10 == 0 or step == config.steps - 1:
            say(f"step {step + 1}/{config.steps}  loss {loss.item():.3f}  {time.monotonic() - t0:.0f}s")
    train_s = time.monotonic() - t0
    for p in params:
        p.requires_grad_(False)
    out = Path(out_dir)
    write_checkpoint(out, cfg, weights, raw_tok)
    from mkcode.backend.demo.shipped import seal_checkpoint

    seal_checkpoint(out, config.version)
    report: dict[str, Any] = {
        "version": config.version,
        "train_seconds": round(train_s, 1),
        "config": config.key(),
        "losses": losses,
    }
    if config.eval_dialogues:
        from mkcode.backend.demo.evaluate import tool_call_rate

        report["eval"] = tool_call_rate(cfg, weights, tok, tools, config.seed + 1, config.eval_dialogues)
        say(f"fresh dialogues with a valid tool call: {report['eval']['valid']}/{report['eval']['total']}")
    (out / "demo_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return out


def write_checkpoint(out: Path, cfg: Any, weights: Any, raw_tok: Any, dtype: Any = None) -> None:
    """A normal HF checkpoint directory, through the checkpoint package's writers; weights stored in
    bfloat16 (half the size; the CPU runtime computes in float32)."""
    import torch

    dtype = dtype or torch.bfloat16
    from mkcode.backend.chat.template import chat_template
    from mkcode.backend.chat.tokenizer_synth import save_tokenizer_files
    from mkcode.backend.checkpoint.writer import TensorSpec, write_safetensors_shards

    out.mkdir(parents=True, exist_ok=True)
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    eos: Any = list(cfg.eos_token_ids) if len(cfg.eos_token_ids) != 1 else cfg.eos_token_ids[0]
    gen = {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": cfg.pad_token_id,
        "do_sample": False,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    save_tokenizer_files(raw_tok, out, chat_template())
    specs = []
    for name, t in weights.state_dict(cfg).items():
        t = t.detach().to(dtype).contiguous()
        specs.append(TensorSpec(name, tuple(t.shape), t.dtype, lambda t=t: t))
    write_safetensors_shards(specs, out, shard_bytes=64 << 20)


def main(argv: list[str] | None = None) -> int:
    """`python -m mkcode.backend.demo.trainer --out DIR`: train, seal and evaluate a demo checkpoint."""
    p = argparse.ArgumentParser(prog="python -m mkcode.backend.demo.trainer", description=main.__doc__)
    p.add_argument("--out", type=Path, required=True, help="directory to write (must not exist)")
    p.add_argument("--steps", type=int, help="training steps (default: the trainer's)")
    p.add_argument("--seed", type=int, help="training seed (default 0)")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation (REPORT.md)")
    args = p.parse_args(argv)
    return train_to(args.out, args.steps, args.seed, evaluate=not args.no_eval)


def train_to(out: Path, steps: int | None, seed: int | None, *, evaluate: bool = True) -> int:
    from dataclasses import replace

    if out.exists():
        print(f"error: {out} exists; choose a new directory", file=sys.stderr)
        return 2
    config = DemoTrainConfig()
    if steps is not None:
        config = replace(config, steps=steps)
    if seed is not None:
        config = replace(config, seed=seed)
    train_demo_model(out, config, lambda msg: print(msg, file=sys.stderr, flush=True))
    if evaluate:
        from mkcode.backend.demo.evaluate import evaluate_checkpoint, write_report

        result = evaluate_checkpoint(out)
        write_report(out, result)
        print(result.summary(), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
