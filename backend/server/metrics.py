"""GET /metrics: the engine's metrics (and the server's request counts) in Prometheus text format."""

from __future__ import annotations

from dataclasses import fields

from mkcode.backend.server.state import ServerState

# EngineMetrics fields that only grow; the rest are gauges.
_COUNTERS = {
    "prompt_tokens_total",
    "decode_tokens_total",
    "preemptions",
    "requests_finished",
    "decode_sequence_steps",
    "spec_verify_steps",
    "spec_draft_tokens",
    "spec_accepted_tokens",
}
_HELP = {
    "running": "sequences admitted (prefilling or decoding)",
    "waiting": "requests queued for admission",
    "kv_pages_total": "KV pages in the pool",
    "kv_pages_used": "KV pages in use (including prefix-cache pages)",
    "kv_tokens_capacity": "tokens the KV pool can hold",
    "prefix_hit_rate": "share of prompt blocks served from the prefix cache",
    "prompt_tokens_total": "prompt tokens prefilled",
    "decode_tokens_total": "tokens decoded",
    "prompt_tokens_per_s": "recent prefill throughput",
    "decode_tokens_per_s": "recent decode throughput",
    "preemptions": "sequences preempted under KV pressure",
    "requests_finished": "requests finished (any reason)",
    "decode_sequence_steps": "sequence-steps of decode (a speculative verify step counts once)",
    "spec_verify_steps": "sequence-steps that verified speculative drafts",
    "spec_draft_tokens": "speculative draft tokens verified",
    "spec_accepted_tokens": "speculative draft tokens accepted",
}


def _name(field: str) -> str:
    name = f"mkcode_engine_{field}"
    return name if field not in _COUNTERS or field.endswith("_total") else name + "_total"


def prometheus_text(state: ServerState) -> str:
    m = state.engine.metrics()
    lines: list[str] = []
    for f in fields(m):
        name = _name(f.name)
        kind = "counter" if f.name in _COUNTERS else "gauge"
        lines.append(f"# HELP {name} {_HELP.get(f.name, f.name)}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name} {float(getattr(m, f.name)):g}")
    lines.append("# HELP mkcode_engine_kv_usage share of KV pages in use")
    lines.append("# TYPE mkcode_engine_kv_usage gauge")
    lines.append(f"mkcode_engine_kv_usage {m.kv_usage:g}")
    lines.append("# HELP mkcode_engine_spec_acceptance_rate share of speculative drafts accepted")
    lines.append("# TYPE mkcode_engine_spec_acceptance_rate gauge")
    lines.append(f"mkcode_engine_spec_acceptance_rate {m.spec_acceptance_rate:g}")
    steps = getattr(getattr(state.engine, "backend", None), "steps", None)
    if isinstance(steps, dict):  # a hybrid decode backend: the steps each of its backends ran
        lines.append("# HELP mkcode_engine_decode_steps_total decode steps, by the backend that ran them")
        lines.append("# TYPE mkcode_engine_decode_steps_total counter")
        for backend, count in sorted(steps.items()):
            lines.append(f'mkcode_engine_decode_steps_total{{backend="{backend}"}} {count}')
    lines.append("# HELP mkcode_http_requests_total HTTP requests answered, by path and status")
    lines.append("# TYPE mkcode_http_requests_total counter")
    for (path, status), count in sorted(state.requests_total.items()):
        lines.append(f'mkcode_http_requests_total{{path="{path}",status="{status}"}} {count}')
    return "\n".join(lines) + "\n"
