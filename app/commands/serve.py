"""`mkcode serve`: an OpenAI-compatible HTTP server over a checkpoint (for OpenCode, Codex CLI, …).

Binds 127.0.0.1 unless --host says otherwise; --api-key (or MKCODE_API_KEY) makes every /v1
request need `Authorization: Bearer <key>`. `--print-opencode-config` / `--print-codex-config`
print a client configuration for this server and exit (no model is loaded).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_PORT = 8080
DEFAULT_OUTPUT_TOKENS = 16384


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
        "--served-model-name", default=None, help="model id clients use (default: the checkpoint dir name)"
    )
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--decode", default="auto", choices=["auto", "torch", "graph", "megakernel"])
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    p.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body accepted (MiB)")
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


def _model_config(model: Path | None) -> dict[str, Any]:
    if model is None or not (model / "config.json").exists():
        return {}
    return json.loads((model / "config.json").read_text())


def _served_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    return Path(args.model).resolve().name if args.model else "mkcode"


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


def run(args: argparse.Namespace) -> int:
    base_url = f"http://{_client_host(args.host)}:{args.port}/v1"
    name = _served_name(args)
    if args.print_opencode_config or args.print_codex_config:
        from mkcode.backend.server.client_config import codex_config, opencode_config

        if args.print_opencode_config:
            context = args.max_model_len or _model_config(args.model).get("max_position_embeddings") or 131072
            output = min(DEFAULT_OUTPUT_TOKENS, max(1, context // 4))
            print(json.dumps(opencode_config(base_url, name, context=context, output=output), indent=2))
        if args.print_codex_config:
            print(codex_config(base_url, name), end="")
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

    from mkcode.backend.runtime import RuntimeOptions, build_runtime
    from mkcode.backend.server import ServerOptions, create_app
    from mkcode.backend.server.runner import serve_forever

    rt = build_runtime(
        RuntimeOptions(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            decode=args.decode,
            max_model_len=args.max_model_len,
        )
    )
    options = ServerOptions(
        served_model_name=name,
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
    try:
        serve_forever(app, args.host, args.port, args.log_level)
    finally:
        rt.close()
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
