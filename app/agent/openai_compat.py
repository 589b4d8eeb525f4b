"""`OpenAICompatClient`: the agent's model backend over any OpenAI-compatible chat completions URL
(a remote `mkcode serve`, vLLM, llama.cpp, ...), streamed over SSE (httpx with httpx-sse).

A request that fails before its stream begins (the server unreachable, HTTP 429 or 5xx) is tried
again after a backoff (`RetryPolicy`: doubling delays, or the server's Retry-After when it sends
one, capped); once events have been yielded nothing is retried, since the turn has begun.

Tool calls arrive as deltas keyed by `index`: the first carries `id` and `function.name`, later ones
append to `function.arguments`. They are assembled and checked when the stream ends; a call without
a name or with arguments that are not a JSON object becomes `MalformedOutput`. Reasoning is read
from `delta.reasoning_content` (or `delta.reasoning`). Token counts for the context budget are
estimated (about 4 characters per token) until the server reports real usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

from mkcode.app.agent.client import (
    ChatRequest,
    MalformedOutput,
    ModelDone,
    ModelEvent,
    ReasoningChunk,
    TextChunk,
    ToolCallBegin,
    ToolCallReady,
    estimate_tokens,
)
from mkcode.app.agent.events import Usage

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
SSE_HEADERS = {"Accept": "text/event-stream", "Cache-Control": "no-store"}


@dataclass(frozen=True)
class RetryPolicy:
    """Tries per request and the backoff between them (delay n: base * 2**n, at most max)."""

    attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), self.max_delay_s)
            except ValueError:
                pass  # an HTTP date: the usual backoff
        return min(self.base_delay_s * (2**attempt), self.max_delay_s)


@dataclass
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    announced: bool = False


def wire_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as OpenAI expects them: no mkcode-only fields (reasoning stays local)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k not in ("reasoning_content", "reasoning", "thinking")}
        if m.get("role") == "assistant" and m.get("tool_calls") and not m.get("content"):
            m["content"] = None
        out.append(m)
    return out


class OpenAICompatClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        context_window: int = 32_768,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._retry = retry or RetryPolicy()
        self._model = model
        self._context_window = context_window
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout_s, connect=10.0), transport=transport
        )
        self._calibration: tuple[int, int] | None = None  # (estimated, real) prompt tokens, last call

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def context_window(self) -> int:
        return self._context_window

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
        est = estimate_tokens(json.dumps(list(messages), ensure_ascii=False) + json.dumps(list(tools)))
        if self._calibration and self._calibration[0] > 0:  # scale by what the server last reported
            est = int(est * self._calibration[1] / self._calibration[0])
        return est

    def _body(self, request: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": wire_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.tools:
            body["tools"] = request.tools
        if request.seed is not None:
            body["seed"] = request.seed
        return body

    async def _send(self, url: str, body: dict[str, Any]) -> tuple[httpx.Response, int]:
        """POST with retries: the first response not worth retrying (its body unread) and the
        number of attempts it took. Raises the last connect error when every attempt failed."""
        policy = self._retry
        req = self._http.build_request("POST", url, json=body, headers=SSE_HEADERS)
        attempt = 1
        while True:
            try:
                resp = await self._http.send(req, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if attempt >= policy.attempts:
                    raise
                wait = policy.delay(attempt - 1)
            else:
                if resp.status_code not in RETRY_STATUS or attempt >= policy.attempts:
                    return resp, attempt
                await resp.aclose()
                wait = policy.delay(attempt - 1, resp.headers.get("retry-after"))
            await asyncio.sleep(wait)
            attempt += 1

    async def stream(self, request: ChatRequest) -> AsyncIterator[ModelEvent]:
        url = f"{self.base_url}/chat/completions"
        estimated = self.count_tokens(request.messages, request.tools)
        calls: dict[int, _PartialCall] = {}
        usage = Usage()
        finish: str | None = None
        try:
            resp, attempts = await self._send(url, self._body(request))
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            n = self._retry.attempts
            yield ModelDone(
                "error",
                usage,
                f"cannot reach the model server at {url} ({n} attempt{'s' * (n > 1)}): {type(e).__name__}: {e}",
            )
            return
        except httpx.HTTPError as e:
            yield ModelDone(
                "error", usage, f"cannot reach the model server at {url}: {type(e).__name__}: {e}"
            )
            return
        try:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                tried = f" (after {attempts} attempts)" if attempts > 1 else ""
                yield ModelDone(
                    "error", usage, f"HTTP {resp.status_code} from {url}{tried}: {_error_text(text)}"
                )
                return
            async for event in EventSource(resp).aiter_sse():
                data = event.data
                if data.startswith("[DONE]"):
                    break
                if not data:
                    continue  # an event without data (a keep-alive)
                try:
                    chunk = json.loads(data)
                except ValueError:
                    yield ModelDone("error", usage, f"the server sent an unreadable event: {data[:200]!r}")
                    return
                if isinstance(chunk, dict) and chunk.get("error"):
                    yield ModelDone("error", usage, _error_text(json.dumps(chunk)))
                    return
                if chunk.get("usage"):
                    usage = _usage(chunk["usage"])
                for ev in _choice_events(calls, chunk):
                    if isinstance(ev, str):
                        finish = ev
                    else:
                        yield ev
        except SSEError as e:
            yield ModelDone("error", usage, f"the server at {url} did not stream events: {e}")
            return
        except httpx.HTTPError as e:
            yield ModelDone("error", usage, f"the stream from {url} broke off: {type(e).__name__}: {e}")
            return
        finally:
            await resp.aclose()
        ready = False
        for index in sorted(calls):
            ev = _complete(index, calls[index])
            ready |= isinstance(ev, ToolCallReady)
            yield ev
        if usage.prompt_tokens:
            self._calibration = (estimated, usage.prompt_tokens)
        reason = "tool_calls" if ready else ("length" if finish == "length" else "stop")
        yield ModelDone(reason, usage)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self._http.aclose()


def _usage(u: Mapping[str, Any]) -> Usage:
    details = u.get("prompt_tokens_details") or {}
    return Usage(
        u.get("prompt_tokens", 0) or 0,
        u.get("completion_tokens", 0) or 0,
        details.get("cached_tokens", 0) or 0,
    )


def _choice_events(calls: dict[int, _PartialCall], chunk: Mapping[str, Any]) -> list[ModelEvent | str]:
    """The events of one chunk's choices, in order; a finish reason comes as a plain string."""
    out: list[ModelEvent | str] = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out.append(ReasoningChunk(reasoning))
        if isinstance(delta.get("content"), str) and delta["content"]:
            out.append(TextChunk(delta["content"]))
        for tc in delta.get("tool_calls") or []:
            out.extend(_tool_delta(calls, tc))
        if choice.get("finish_reason"):
            out.append(str(choice["finish_reason"]))
    return out


def _tool_delta(calls: dict[int, _PartialCall], tc: Mapping[str, Any]) -> list[ModelEvent]:
    index = tc.get("index")
    if not isinstance(index, int):
        index = len(calls) if tc.get("id") else max(calls, default=0)
    call = calls.setdefault(index, _PartialCall())
    if tc.get("id") is not None:
        call.call_id = str(tc["id"])
    fn = tc.get("function") or {}
    if fn.get("name"):
        call.name += fn["name"]
    if fn.get("arguments"):
        call.arguments += fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
    if call.name and not call.announced:
        call.announced = True
        return [ToolCallBegin(index, call.call_id or str(index), call.name)]
    return []


def _complete(index: int, call: _PartialCall) -> ModelEvent:
    if not call.name:
        return MalformedOutput(f"tool call {index} has no function name")
    raw = call.arguments.strip() or "{}"
    try:
        args = json.loads(raw)
    except ValueError as e:
        short = raw if len(raw) <= 200 else raw[:200] + "…"
        return MalformedOutput(
            f"tool call {index} ({call.name}): arguments are not valid JSON ({e}): {short!r}"
        )
    if not isinstance(args, dict):
        return MalformedOutput(f"tool call {index} ({call.name}): arguments must be a JSON object")
    return ToolCallReady(index, call.call_id or str(index), call.name, json.dumps(args, ensure_ascii=False))


def _error_text(body: str) -> str:
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (ValueError, AttributeError):
        pass
    return body[:500]
