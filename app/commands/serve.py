"""`mkcode serve`: an OpenAI-compatible HTTP server over a checkpoint (for OpenCode, Codex CLI, …).

Binds 127.0.0.1 unless --host says otherwise; --api-key (or MKCODE_API_KEY) makes every /v1
request need `Authorization: Bearer <key>`. `--print-opencode-config` / `--print-codex-config`
print a client configuration for this server and exit (no model is loaded).

`--tensor-parallel N` / `--expert-parallel N` split the model over N GPUs of this host. Typed
directly, the command re-launches itself as N ranks through torchrun (supervised by
backend/parallel/supervise.py: Ctrl+C reaches only this process, which then stops rank 0 and,
through it, the others); under torchrun (WORLD_SIZE set) rank 0 serves HTTP over the parallel
runtime and the other ranks run its steps.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from mkcode.app.settings import DECODES, add_speculative_flags
from mkcode.backend.server.options import DEFAULT_MAX_OUTPUT_TOKENS, output_cap

DEFAULT_PORT = 8080
_PARSER: argparse.ArgumentParser | None = None  # the serve sub-parser: re-launch forwards its flags
_NOT_FORWARDED = {"help", "api_key", "print_opencode_config", "print_codex_config"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    p.add_argument("--model", type=Path, help="checkpoint directory (Hugging Face format)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument(
        "--api-key", default=None, help="require this bearer key (default: $MKCODE_API_KEY if set)"
    )
    p.add_argument(
        "--served-model-name",
        action="append",
        default=None,
        help="model id clients use (default: the checkpoint dir name); repeat it to add aliases",
    )
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--decode", default="auto", choices=list(DECODES))
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    add_speculative_flags(p, default=True)
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="split attention, dense MLP and LM head over N GPUs of this host (1 or the GPU count)",
    )
    p.add_argument(
        "--expert-parallel",
        type=int,
        default=1,
        metavar="N",
        help="split the routed experts over N GPUs of this host (1 or the GPU count)",
    )
    p.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body accepted (MiB)")
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=DEFAULT_MAX_OUTPUT_TOKENS,
        metavar="N",
        help="output limit of a request that sets none: N, at most a quarter of the context "
        f"(default {DEFAULT_MAX_OUTPUT_TOKENS}; 0: up to the end of the context)",
    )
    p.add_argument(
        "--forced-thinking-tokens",
        type=int,
        default=1024,
        help="longest plan before a forced tool call or JSON answer (default 1024)",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument(
        "--print-opencode-config", action="store_true", help="print an opencode.json for this server"
    )
    p.add_argument("--print-codex-config", action="store_true", help="print a Codex CLI config.toml fragment")
    p.set_defaults(func=run)
    global _PARSER
    _PARSER = p


def _model_config(model: Path | None) -> dict[str, Any]:
    if model is None or not (model / "config.json").exists():
        return {}
    return json.loads((model / "config.json").read_text())


def _served_names(args: argparse.Namespace) -> list[str]:
    """The model's name and its aliases (`--served-model-name`, repeatable)."""
    if args.served_model_name:
        return list(dict.fromkeys(args.served_model_name))
    return [Path(args.model).resolve().name if args.model else "mkcode"]


def _served_name(args: argparse.Namespace) -> str:
    return _served_names(args)[0]


def _context(args: argparse.Namespace) -> int:
    """The served context: --max-model-len, else the checkpoint's, else 131072."""
    return int(args.max_model_len or _model_config(args.model).get("max_position_embeddings") or 131072)


def _output_limit(args: argparse.Namespace, context: int) -> int:
    """What a client should ask for at most: the server's default output cap for this context."""
    return output_cap(context, args.default_max_tokens or DEFAULT_MAX_OUTPUT_TOKENS)


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _generation_defaults(model: Path) -> dict[str, Any]:
    """temperature/top_p/top_k from the checkpoint's generation_config.json, if it has them."""
    path = model / "generation_config.json"
    if not path.exists():
        return {}
    cfg = json.loads(path.read_text())
    out: dict[str, Any] = {}
    if cfg.get("do_sample") is False:
        out["temperature"] = 0.0
    for key in ("temperature", "top_p", "top_k"):
        if isinstance(cfg.get(key), int | float) and not isinstance(cfg.get(key), bool):
            out.setdefault(key, cfg[key])
    return out


def _runtime_options(args: argparse.Namespace):
    from mkcode.backend.runtime import RuntimeOptions

    return RuntimeOptions(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        decode=args.decode,
        max_model_len=args.max_model_len,
        speculative=args.speculative,
        spec_k=args.spec_k,
    )


def _app(rt, args: argparse.Namespace, name: str, api_key: str | None, base_url: str):
    """The FastAPI app over a built runtime (single GPU or rank 0 of a parallel one)."""
    from mkcode.backend.server import ServerOptions, create_app

    options = ServerOptions(
        served_model_name=name,
        model_aliases=tuple(_served_names(args)[1:]),
        default_max_tokens=args.default_max_tokens or None,
        api_key=api_key,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        default_sampling=_generation_defaults(args.model),
        forced_thinking_tokens=args.forced_thinking_tokens,
    )
    app = create_app(rt, options=options)
    print(
        f"mkcode serve: {name} on {base_url} (decode backend: {rt.decode_backend}; {rt.decode_note})",
        file=sys.stderr,
    )
    return app


def run(args: argparse.Namespace) -> int:
    base_url = f"http://{_client_host(args.host)}:{args.port}/v1"
    name = _served_name(args)
    if args.print_opencode_config or args.print_codex_config:
        from mkcode.backend.server.client_config import codex_config, opencode_config

        context = _context(args)
        output = _output_limit(args, context)
        if args.print_opencode_config:
            print(json.dumps(opencode_config(base_url, name, context=context, output=output), indent=2))
        if args.print_codex_config:
            print(codex_config(base_url, name, context=context, output=output), end="")
        return 0
    if args.model is None:
        print("mkcode serve: --model is required", file=sys.stderr)
        return 2
    api_key = args.api_key or os.environ.get("MKCODE_API_KEY") or None
    if not _is_loopback(args.host) and not api_key:
        print(
            f"mkcode serve: warning: listening on {args.host} without --api-key; anyone who can reach "
            "this port can use the model",
            file=sys.stderr,
        )

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if args.tensor_parallel != 1 or args.expert_parallel != 1 or world > 1:
        return _run_parallel(args, name, api_key, base_url)

    from mkcode.backend.runtime import build_runtime
    from mkcode.backend.server.runner import serve_forever

    rt = build_runtime(_runtime_options(args))
    app = _app(rt, args, name, api_key, base_url)
    try:
        serve_forever(app, args.host, args.port, args.log_level)
    finally:
        rt.close()
    return 0


# ---- tensor / expert parallel ----------------------------------------------------------------------


def _run_parallel(args: argparse.Namespace, name: str, api_key: str | None, base_url: str) -> int:
    from mkcode.backend.checkpoint.errors import CheckpointError
    from mkcode.backend.checkpoint.loader import read_config
    from mkcode.backend.parallel.plan import PlanError, ShardPlan
    from mkcode.backend.parallel.runtime import PARALLEL_DECODE, check_devices, world_degrees

    tp, ep = args.tensor_parallel, args.expert_parallel
    under_torchrun = "WORLD_SIZE" in os.environ
    try:
        n = world_degrees(tp, ep, int(os.environ["WORLD_SIZE"]) if under_torchrun else None)
        if args.decode not in PARALLEL_DECODE:
            raise ValueError(
                f"--decode {args.decode}: with tensor/expert parallelism the decode backend is the "
                "sharded torch path (choose auto or torch)"
            )
        check_devices(args.device, n)
        ShardPlan(n, 0, tp=tp, ep=ep).validate(read_config(args.model))
    except (PlanError, ValueError, RuntimeError, CheckpointError) as e:
        print(f"mkcode serve: {e}", file=sys.stderr)
        return 2
    if not under_torchrun:
        return _launch_ranks(args, n, name, api_key)
    return _serve_rank(args, name, api_key, base_url)


def _forwarded_argv(args: argparse.Namespace, name: str) -> list[str]:
    """This command's flags for the ranks (the API key travels in the environment, not argv)."""
    assert _PARSER is not None
    out: list[str] = []
    for action in _PARSER._actions:
        if not action.option_strings or action.dest in _NOT_FORWARDED:
            continue
        if action.dest == "served_model_name":
            for served in _served_names(args):
                out += [action.option_strings[-1], served]
            continue
        value = getattr(args, action.dest, None)
        if (
            value is None
            or value is False
            or (value == action.default and action.dest != "served_model_name")
        ):
            continue
        flag = action.option_strings[-1]
        out += [flag] if value is True else [flag, str(value)]
    return out


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _launch_ranks(args: argparse.Namespace, n: int, name: str, api_key: str | None) -> int:
    """Re-run this command as `n` ranks under torchrun (backend/parallel/supervise.py owns the
    start, the wait and the ordered stop); the API key travels in the environment, not argv."""
    from mkcode.backend.parallel.supervise import RankLaunch, run_ranks

    if not _port_free(args.host, args.port):
        print(f"mkcode serve: {args.host}:{args.port} is already in use", file=sys.stderr)
        return 2
    launch = RankLaunch(
        n=n,
        module="mkcode.app.cli",
        args=["serve", *_forwarded_argv(args, name)],
        env={"MKCODE_API_KEY": api_key} if api_key else {},
    )
    print(
        f"mkcode serve: starting {n} ranks (tensor-parallel {args.tensor_parallel}, "
        f"expert-parallel {args.expert_parallel})",
        file=sys.stderr,
    )
    return run_ranks(launch, log=lambda line: print(f"mkcode serve: {line}", file=sys.stderr))


def _serve_rank(args: argparse.Namespace, name: str, api_key: str | None, base_url: str) -> int:
    """One rank under torchrun: rank 0 serves HTTP, the others run rank 0's steps until it stops."""
    from mkcode.backend.parallel.launch import set_parent_death_signal
    from mkcode.backend.runtime import build_parallel_runtime
    from mkcode.backend.server.runner import serve_forever

    set_parent_death_signal(signal.SIGKILL)  # torchrun gone: no rank outlives it

    def hand_signals_to_rank0() -> None:
        # Ranks 1.. leave shutdown to rank 0: it finishes the step in flight and then releases them.
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)

    rt = build_parallel_runtime(
        _runtime_options(args),
        args.tensor_parallel,
        args.expert_parallel,
        before_serve=hand_signals_to_rank0,
    )
    if rt is None:
        return 0
    try:
        app = _app(rt, args, name, api_key, base_url)
        # uvicorn stops gracefully on SIGINT/SIGTERM and then re-raises the signal to the handler
        # found before it: make that a no-op so the `finally` below always releases the ranks.
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda signum, frame: None)
        serve_forever(app, args.host, args.port, args.log_level)
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        rt.close()
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
