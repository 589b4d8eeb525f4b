"""Check what the demo model learned: greedy decoding on fresh dialogues, parsed as cmd4."""

from __future__ import annotations

import random
from typing import Any


def greedy(cfg: Any, weights: Any, prompt: list[int], eos: set[int], max_new: int = 120) -> list[int]:
    """Greedy continuation with the reference model and a dense KV cache."""
    from mkcode.backend.model.reference import ReferenceModel

    model = ReferenceModel(cfg, weights)
    cache = model.new_cache(len(prompt) + max_new + 1)
    logits = model.prefill(cache, prompt)
    out: list[int] = []
    for _ in range(max_new):
        t = int(logits.argmax())
        out.append(t)
        if t in eos:
            break
        logits = model.decode(cache, t, len(prompt) + len(out) - 1)
    return out


def tool_call_rate(
    cfg: Any, weights: Any, tok: Any, tools: list[dict[str, Any]], seed: int, n: int
) -> dict[str, Any]:
    """How many of `n` fresh first turns decode to at least one valid tool call of a known tool."""
    from mkcode.backend.chat.parser import parse_full
    from mkcode.backend.demo.dialogues import fresh_prompt

    names = {t["function"]["name"] for t in tools}
    rng = random.Random(seed)
    valid, samples = 0, []
    for _ in range(n):
        messages = fresh_prompt(rng)
        ids = tok.apply_chat_template(messages, tools, add_generation_prompt=True)
        text = tok.decode(greedy(cfg, weights, ids, set(tok.eos_token_ids)), skip_special_tokens=False)
        parsed = parse_full(text)
        ok = bool(parsed.tool_calls) and all(c.name in names for c in parsed.tool_calls) and not parsed.errors
        valid += ok
        samples.append({"user": messages[-1]["content"], "output": text, "valid": ok})
    return {"valid": valid, "total": n, "samples": samples}
