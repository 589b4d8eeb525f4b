"""`OpenAICompatClient`: the agent's model backend over any OpenAI-compatible chat completions URL
(a remote `mkcode serve`, vLLM, llama.cpp, ...), streamed over SSE with httpx.

Tool calls arrive as deltas keyed by `index`: the first carries `id` and `function.name`, later ones
append to `function.arguments`. They are assembled and checked when the stream ends; a call without
a name or with arguments that are not a JSON object becomes `MalformedOutput`. Reasoning is read
from `delta.reasoning_content` (or `delta.reasoning`). Token counts for the context budget are
estimated (about 4 characters per token) until the server reports real usage.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

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
    ) -> None:
        self.base_url = base_url.rstrip("/")
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

    async def stream(self, request: ChatRequest) -> AsyncIterator[ModelEvent]:
        url = f"{self.base_url}/chat/completions"
        estimated = self.count_tokens(request.messages, request.tools)
        calls: dict[int, _PartialCall] = {}
        usage = Usage()
        finish: str | None = None
        try:
            async with self._http.stream("POST", url, json=self._body(request)) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread()).decode("utf-8", "replace")
                    yield ModelDone(
                        "error", usage, f"HTTP {resp.status_code} from {url}: {_error_text(body)}"
                    )
                    return
                async for data in _sse_data(resp):
                    if data.startswith("[DONE]"):
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        yield ModelDone(
                            "error", usage, f"the server sent an unreadable event: {data[:200]!r}"
                        )
                        return
                    if isinstance(chunk, dict) and chunk.get("error"):
                        yield ModelDone("error", usage, _error_text(json.dumps(chunk)))
                        return
                    if chunk.get("usage"):
                        u = chunk["usage"]
                        details = u.get("prompt_tokens_details") or {}
                        usage = Usage(
                            u.get("prompt_tokens", 0) or 0,
                            u.get("completion_tokens", 0) or 0,
                            details.get("cached_tokens", 0) or 0,
                        )
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                        if isinstance(reasoning, str) and reasoning:
                            yield ReasoningChunk(reasoning)
                        if isinstance(delta.get("content"), str) and delta["content"]:
                            yield TextChunk(delta["content"])
                        for tc in delta.get("tool_calls") or []:
                            for ev in _tool_delta(calls, tc):
                                yield ev
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
        except httpx.HTTPError as e:
            yield ModelDone(
                "error", usage, f"cannot reach the model server at {url}: {type(e).__name__}: {e}"
            )
            return
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


async def _sse_data(resp: httpx.Response) -> AsyncIterator[str]:
    """The `data:` payloads of an SSE stream (multi-line data joined with newlines)."""
    lines: list[str] = []
    async for line in resp.aiter_lines():
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith(":"):
            continue
        if line.startswith("data:"):
            lines.append(line[5:].lstrip(" "))
    if lines:
        yield "\n".join(lines)


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
