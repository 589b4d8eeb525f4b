"""`mkcode generate`: completions from a checkpoint through the engine, streamed or as JSON.

One prompt (`--prompt`, `--prompt-ids`, `--chat`) streams to the terminal; `--prompts-file`
runs a JSONL file of requests concurrently through the engine's continuous batching.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mkcode.app.settings import DECODES, add_speculative_flags

SAMPLING_FLAGS = ("max_tokens", "temperature", "top_p", "top_k", "seed")
REQUEST_KEYS = {"id", "prompt", "prompt_ids", "messages", "tools", "stop", "ignore_eos", *SAMPLING_FLAGS}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="generate completions from a checkpoint (streams; --json for machines)"
    )
    p.add_argument("--model", required=True, type=Path, help="checkpoint directory (Hugging Face format)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text (no chat template)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids, e.g. 1,2,3")
    src.add_argument("--chat", help="a user message, rendered with the checkpoint's chat template")
    src.add_argument(
        "--prompts-file",
        type=Path,
        help="JSONL: one request a line (id, prompt|prompt_ids|messages, sampling)",
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16"], help="default: bf16 on GPU, fp32 on CPU"
    )
    p.add_argument("--decode", default="auto", choices=list(DECODES))
    add_speculative_flags(p, default=True)
    p.add_argument("--json", action="store_true", help="print JSON instead of streaming text")
    p.set_defaults(func=run)


def _sampling(args: argparse.Namespace, overrides: dict[str, Any] | None = None):
    from mkcode.backend.sampling import SamplingParams

    d: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": tuple(args.stop),
    }
    d.update(overrides or {})
    return SamplingParams.from_dict(d)


def _read_requests(path: Path) -> list[dict[str, Any]]:
    reqs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{n}: each line must be a JSON object")
        unknown = sorted(set(obj) - REQUEST_KEYS)
        if unknown:
            raise ValueError(f"{path}:{n}: unknown field(s) {unknown}; known: {sorted(REQUEST_KEYS)}")
        if sum(k in obj for k in ("prompt", "prompt_ids", "messages")) != 1:
            raise ValueError(f"{path}:{n}: give exactly one of prompt, prompt_ids, messages")
        obj.setdefault("id", f"line-{n}")
        reqs.append(obj)
    if not reqs:
        raise ValueError(f"{path}: no requests")
    return reqs


def _prompt_ids(rt, obj: dict[str, Any]) -> list[int]:
    if "prompt_ids" in obj:
        ids = obj["prompt_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"request {obj.get('id')}: prompt_ids must be a list of integers")
        return ids
    if "messages" in obj:
        return rt.tokenizer.apply_chat_template(
            obj["messages"], tools=obj.get("tools"), add_generation_prompt=True
        )
    return rt.tokenizer.encode(obj["prompt"])


def run(args: argparse.Namespace) -> int:
    from mkcode.backend.engine.request import GenerationRequest, RequestError, TokenEvent
    from mkcode.backend.runtime import RuntimeOptions, build_runtime
    from mkcode.backend.sampling import SamplingError

    try:
        sampling = _sampling(args)
        requests = _read_requests(args.prompts_file) if args.prompts_file else None
    except (ValueError, SamplingError, OSError) as e:
        print(f"mkcode generate: {e}", file=sys.stderr)
        return 2
    rt = build_runtime(
        RuntimeOptions(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            decode=args.decode,
            progress=not args.json,
            speculative=args.speculative,
            spec_k=args.spec_k,
        )
    )
    engine = rt.engine.start()
    try:
        if requests is not None:
            return _run_file(rt, engine, requests, args)
        if args.prompt_ids is not None:
            try:
                ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
            except ValueError:
                print("mkcode generate: --prompt-ids must be comma-separated integers", file=sys.stderr)
                return 2
        elif args.chat is not None:
            ids = rt.tokenizer.apply_chat_template(
                [{"role": "user", "content": args.chat}], add_generation_prompt=True
            )
        else:
            ids = rt.tokenizer.encode(args.prompt)
        try:
            stream = engine.submit(GenerationRequest(ids, sampling))
        except RequestError as e:
            print(f"mkcode generate: {e}", file=sys.stderr)
            return 2
        out_ids: list[int] = []
        parts: list[str] = []
        final = None
        for ev in stream:
            if isinstance(ev, TokenEvent):
                out_ids += ev.token_ids
                parts.append(ev.text)
                if not args.json:
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
            else:
                final = ev
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt_ids": ids,
                        "token_ids": out_ids,
                        "text": "".join(parts),
                        "finish_reason": final.reason,
                        "usage": {
                            "prompt_tokens": final.usage.prompt_tokens,
                            "completion_tokens": final.usage.completion_tokens,
                        },
                        "decode_backend": rt.decode_backend,
                        "speculative": _speculative(rt, final.usage),
                    },
                    ensure_ascii=False,
                )
            )
        else:
            sys.stdout.write("\n")
        if final.reason == "error":
            print(f"mkcode generate: {final.error}", file=sys.stderr)
            return 1
        return 0
    finally:
        engine.shutdown()


def _speculative(rt, usage) -> dict[str, Any]:
    """The `speculative` object of a --json result: the mode the engine ran and this request's
    drafted / accepted counts."""
    engine = rt.engine
    out: dict[str, Any] = {"mode": engine.speculative, "k": engine.opts.spec_k}
    if usage is not None and usage.speculative is not None:
        out.update(usage.speculative.as_dict())
    else:
        out.update(
            verify_steps=0, draft_tokens=0, accepted_tokens=0, acceptance_rate=0.0, tokens_per_verify=0.0
        )
    return out


def _run_file(rt, engine, requests: list[dict[str, Any]], args: argparse.Namespace) -> int:
    from mkcode.backend.engine.request import GenerationRequest, RequestError
    from mkcode.backend.sampling import SamplingError

    streams = []
    status = 0
    for obj in requests:
        try:
            over = {k: obj[k] for k in (*SAMPLING_FLAGS, "stop", "ignore_eos") if k in obj}
            req = GenerationRequest(_prompt_ids(rt, obj), _sampling(args, over), request_id=str(obj["id"]))
            streams.append((obj["id"], engine.submit(req)))
        except (RequestError, SamplingError, ValueError) as e:
            streams.append((obj["id"], e))
    for rid, s in streams:
        if isinstance(s, Exception):
            status = 1
            rec = {"id": rid, "error": str(s), "token_ids": [], "text": "", "finish_reason": "error"}
        else:
            r = s.result()
            rec = {
                "id": rid,
                "token_ids": r.token_ids,
                "text": r.text,
                "finish_reason": r.finish_reason,
                "speculative": _speculative(rt, r.usage),
            }
            if r.error:
                rec["error"] = r.error
                status = 1
        if args.json:
            print(json.dumps(rec, ensure_ascii=False), flush=True)
        else:
            print(f"== {rid} ({rec['finish_reason']}) ==\n{rec['text']}", flush=True)
    return status
