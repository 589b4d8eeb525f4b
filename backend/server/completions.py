"""POST /v1/completions: raw text (or token ids) in, text out; no chat template, no parsing."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from mkcode.backend.engine.request import FinishEvent, GenerationRequest, TokenEvent
from mkcode.backend.server import openapi
from mkcode.backend.server.asgi import SSE_DONE, SSEResponse, sse_data, until_disconnect
from mkcode.backend.server.chat import SYSTEM_FINGERPRINT, usage_dict
from mkcode.backend.server.errors import bad_request, error_body, error_response
from mkcode.backend.server.limits import check_prompt_fits
from mkcode.backend.server.schemas import CompletionRequest, parse_body
from mkcode.backend.server.state import ServerState
from mkcode.backend.server.turn import sampling_params, submit

router = APIRouter()


def _prompt_ids(state: ServerState, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        if len(prompt) != 1:
            raise bad_request("one prompt per request (a batch of prompts is not supported)", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise bad_request("one prompt per request (a batch of prompts is not supported)", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_prompt_fits(state.tokenizer, state.max_model_len, [prompt], "prompt")
        ids = state.tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        vocab = int(state.engine.cfg.vocab_size)
        if any(not 0 <= t < vocab for t in ids):
            raise bad_request(f"prompt token ids must be in [0, {vocab})", param="prompt")
    if not ids:
        raise bad_request("the prompt is empty", param="prompt")
    return ids


def _build(state: ServerState, body: CompletionRequest) -> tuple[GenerationRequest, str]:
    """The engine request and the echoed prompt text (CPU work: tokenising; runs in a thread)."""
    if body.n not in (None, 1) or body.best_of not in (None, 1):
        raise bad_request("n > 1 and best_of > 1 are not supported by this server", param="n")
    if body.logprobs:
        raise bad_request("logprobs are not supported by this server", param="logprobs")
    if body.suffix:
        raise bad_request("suffix (fill-in-the-middle) is not supported by this server", param="suffix")
    ids = _prompt_ids(state, body)
    if len(ids) >= state.max_model_len:
        raise bad_request(
            f"the prompt is {len(ids)} tokens; this server's context is {state.max_model_len} tokens",
            param="prompt",
            code="context_length_exceeded",
        )
    sampling = sampling_params(
        state,
        len(ids),
        max_tokens=body.max_tokens or 16,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=body.stop,
    )
    return GenerationRequest(ids, sampling), (state.tokenizer.decode(ids) if body.echo else "")


@router.post(
    "/v1/completions", responses=openapi.COMPLETIONS, openapi_extra=openapi.request_body(CompletionRequest)
)
async def completions(request: Request):
    body = await parse_body(request, CompletionRequest)
    state: ServerState = request.app.state.mkcode
    model = state.resolve_model(body.model)
    req, echo = await asyncio.to_thread(_build, state, body)
    stream = submit(state, req)
    cid = "cmpl-" + secrets.token_hex(12)
    created = int(time.time())
    base = {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }

    async def events() -> AsyncIterator[bytes]:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        finished = False
        try:
            if echo:
                yield sse_data({**base, "choices": [_choice(echo, None)]})
            async for ev in stream:
                if isinstance(ev, TokenEvent):
                    if ev.text:
                        yield sse_data({**base, "choices": [_choice(ev.text, None)]})
                    continue
                finished = True
                if ev.reason == "error":
                    yield sse_data(error_body(500, f"generation failed: {ev.error}"))
                else:
                    yield sse_data({**base, "choices": [_choice("", ev.reason)]})
                if include_usage:
                    yield sse_data({**base, "choices": [], "usage": usage_dict(ev.usage)})
                yield SSE_DONE
                return
        finally:
            if not finished:
                state.engine.cancel(stream.request_id)

    if body.stream:
        return SSEResponse(events())

    async def collect() -> tuple[str, FinishEvent]:
        parts = []
        try:
            async for ev in stream:
                if isinstance(ev, TokenEvent):
                    parts.append(ev.text)
                else:
                    return "".join(parts), ev
        finally:
            if not stream.finished:
                state.engine.cancel(stream.request_id)
        raise RuntimeError("stream ended without a finish event")

    text, fin = await until_disconnect(request, collect())
    if fin.reason == "error":
        return error_response(500, f"generation failed: {fin.error}")
    return {**base, "choices": [_choice(echo + text, fin.reason)], "usage": usage_dict(fin.usage)}


def _choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
