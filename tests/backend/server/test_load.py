"""Many concurrent streaming clients, some of which hang up mid-stream, through continuous batching.

Every stream that runs to the end must be complete and well formed; every hang-up must cancel its
engine request; afterwards no KV page may be leaked and the server must still answer.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx

from tests.backend.server.conftest import MODEL

N_CLIENTS = 64


async def _one(http: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"request {i} " + "x" * rng.randint(0, 200)}],
        "max_tokens": rng.randint(4, 16),
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 1.0,
        "seed": i,
    }
    hang_up_after = rng.randint(1, 6) if rng.random() < 0.4 else None
    events: list[str] = []
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            events.append(line[6:])
            if hang_up_after is not None and len(events) >= hang_up_after:
                return "hung_up"  # leaving the block closes the connection mid-stream
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    finish = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert len(finish) == 1 and finish[0] in ("stop", "length")
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] <= body["max_tokens"]
    return "complete"


def test_concurrent_streams_with_disconnects(server, runtime):
    engine = runtime.engine
    rng = random.Random(1234)

    async def main() -> list[str]:
        limits = httpx.Limits(max_connections=N_CLIENTS)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as http:
            return await asyncio.gather(
                *(_one(http, i, random.Random(rng.random())) for i in range(N_CLIENTS))
            )

    outcomes = asyncio.run(main())
    assert outcomes.count("complete") + outcomes.count("hung_up") == N_CLIENTS
    assert outcomes.count("hung_up") > 0 and outcomes.count("complete") > 0

    deadline = time.monotonic() + 60
    while engine.has_work() or engine.metrics().running:
        assert time.monotonic() < deadline, "engine never went idle: a hung-up request was not cancelled"
        time.sleep(0.05)
    time.sleep(0.1)
    engine.check_accounting()
    engine.pool.clear_prefix_cache()
    assert engine.pool.num_free == engine.pool.num_pages
    assert httpx.get(server.base_url + "/health").json()["status"] == "ok"
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2},
    )
    assert r.status_code == 200
