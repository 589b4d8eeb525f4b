"""The agent loop: model call → tool calls → results back to the model, until it answers.

One `Agent.run(prompt)` is one user turn. Each step renders the history (system prompt with the
environment and AGENTS.md, then the session's messages) with the tool schemas, streams one assistant
message from the `EngineClient`, and runs the tool calls it contains through the tools package's
`ToolRegistry` (which validates arguments, applies the permission policy and asks the user through
our approver). Consecutive read-only calls run concurrently; edits and shell commands run one at a
time, in the order the model wrote them. Results go back as `tool` messages and the loop continues
until the model answers without tools, or `AgentConfig.max_steps` is reached. Before each step the
`Compactor` (compaction.py) keeps the history inside the context window.

Nothing CPU-heavy runs on the event loop (the UI's): the system prompt (git status, AGENTS.md) and
every token count (the in-process client renders and tokenises) are computed in worker threads.

Invariants, whatever happens (malformed output, backend errors, `interrupt()` at any moment):
every assistant tool call in the history has exactly one tool result right after its message, and
every tool call that was assigned an id is on the session's record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkcode.app.agent import context as ctx
from mkcode.app.agent.client import (
    ChatRequest,
    EngineClient,
    MalformedOutput,
    ModelDone,
    ToolCallBegin,
    ToolCallReady,
)
from mkcode.app.agent.compaction import Compactor
from mkcode.app.agent.config import AgentConfig
from mkcode.app.agent.events import (
    AgentError,
    AgentEvent,
    ApprovalRequested,
    FinishReason,
    Notice,
    ReasoningDelta,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
    Usage,
)
from mkcode.app.agent.prompt import build_system_prompt
from mkcode.app.agent.session import Session
from mkcode.tools import ApprovalRequest, ApprovalResponse, AuditEntry, Decision, ToolKind, ToolRegistry

INTERRUPTED_RESULT = "Interrupted: the user interrupted the turn before this tool call finished."
ABANDONED_RESULT = (
    "Interrupted: the user interrupted the turn while this tool call was running; it may have "
    "partly taken effect. Check before relying on it."
)
_END = object()


@dataclass
class _Step:
    """What one model call produced."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolCallReady] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: ModelDone | None = None
    interrupted: bool = False


@dataclass
class _Call:
    """A tool call of the current step, with the id the agent gave it."""

    call_id: str
    name: str
    arguments: str
    parsed: dict[str, Any] | str


@dataclass
class _Outcome:
    ok: bool
    output: str  # what the model sees
    error: str | None = None
    denied: bool = False
    interrupted: bool = False
    truncated: bool = False
    diff: str | None = None
    duration_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


class Agent:
    """Runs user turns against a model backend and a tool registry, recording into a `Session`.

    `interactive=True` (default) installs the agent's approver on the registry, so calls that need
    permission surface as `ApprovalRequested` events; with False the registry's own approver (None:
    deny) is left alone, as in a non-interactive print mode.
    """

    def __init__(
        self,
        client: EngineClient,
        tools: ToolRegistry,
        *,
        config: AgentConfig | None = None,
        session: Session | None = None,
        cwd: str | Path | None = None,
        interactive: bool = True,
    ) -> None:
        self.client = client
        self.tools = tools
        self.config = config or AgentConfig()
        self.cwd = Path(cwd) if cwd is not None else Path(tools.workspace.root)
        self.session = session or Session(cwd=str(self.cwd), model=client.model_name)
        self._kinds = {s.name: s.kind for s in tools.specs()}
        self._call_seq = len(self.session.tool_calls())
        self._tls = threading.local()  # the call id of the tool call running on this worker thread
        self._queue: asyncio.Queue[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._interrupted = threading.Event()
        self._pending: set[ApprovalRequested] = set()
        self._pending_lock = threading.Lock()
        self._running = False
        self._system_prompt: str | None = None
        self._compactor = Compactor(client, self.config, self.session, self.system_prompt)
        if interactive:
            tools.approver = self._approve
        tools.audit.subscribe(self._on_audit)

    # -- public API ---------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while a turn is running."""
        return self._running

    @property
    def usage(self) -> Usage:
        """Tokens used by the whole session."""
        return self.session.usage

    def system_prompt(self) -> str:
        """The system prompt of the current (or next) turn."""
        if self._system_prompt is None:
            self._system_prompt = build_system_prompt(
                self.cwd,
                instructions=self.config.system_prompt,
                include_agents_md=self.config.include_agents_md,
                roots=self.tools.context.workspace.roots,
                sandbox=self.tools.context.sandbox,
            )
        return self._system_prompt

    def context_tokens(self) -> int:
        """Prompt tokens the next model call would take (system prompt, history and tool schemas)."""
        return self.client.count_tokens(self._request_messages(), self.tools.openai_tools())

    async def run(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Run one user turn; yields events and ends after `TurnFinished`.

        Closing the iterator early interrupts the turn (and waits for it to settle)."""
        if self._running:
            raise RuntimeError("a turn is already running; interrupt() it or wait for TurnFinished")
        self._running = True
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._stop = asyncio.Event()
        self._interrupted.clear()
        self._system_prompt = None  # the environment (date, git status) is read afresh every turn
        if self.tools.context.cancel is None or self.tools.context.cancel.is_set():
            self.tools.context.cancel = threading.Event()
        task = asyncio.create_task(self._turn(prompt))
        try:
            while True:
                event = await self._queue.get()
                if event is _END:
                    break
                yield event
            await task
        finally:
            if not task.done():
                self.interrupt()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task
            self._running = False

    def interrupt(self) -> None:
        """Stop the running turn as soon as possible (any thread; no-op when idle).

        The model's generation is cancelled; pending approvals are answered DENY; a running shell
        command is killed; calls not yet run get an "interrupted" result. The turn then ends with
        `TurnFinished(reason="interrupted")`."""
        if not self._running:
            return
        self._interrupted.set()
        with self._pending_lock:
            pending = list(self._pending)
        for approval in pending:
            approval.answer(ApprovalResponse(Decision.DENY, message="the user interrupted the turn"))
        if self.tools.context.cancel is not None:
            self.tools.context.cancel.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                stop.set()
            else:
                loop.call_soon_threadsafe(stop.set)

    async def compact(self) -> Notice | None:
        """Compact the history now (the `/compact` command); returns what was done, None if nothing."""
        return await self._compactor.run(self.tools.openai_tools(), force=True)

    async def acontext_tokens(self) -> int:
        """`context_tokens()` counted in a worker thread (rendering and tokenising is CPU work)."""
        return await asyncio.to_thread(
            self.client.count_tokens, self._request_messages(), self.tools.openai_tools()
        )

    # -- the turn -------------------------------------------------------------------------------------

    def _emit(self, event: AgentEvent | object) -> None:
        assert self._queue is not None
        self._queue.put_nowait(event)

    def _emit_threadsafe(self, event: AgentEvent) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._emit, event)

    async def _turn(self, prompt: str) -> None:
        turn_usage = Usage()
        steps = 0
        reason: FinishReason = "done"
        error: str | None = None
        try:
            self.session.add_message({"role": "user", "content": prompt})
            prompt_now = await asyncio.to_thread(self.system_prompt)  # reads git status, AGENTS.md
            if not any(
                r["type"] == "system_prompt" and r.get("text") == prompt_now for r in self.session.records
            ):
                self.session.record_event("system_prompt", text=prompt_now)
            while True:
                if self._interrupted.is_set():
                    reason = "interrupted"
                    break
                if steps >= self.config.max_steps:
                    reason = "step_limit"
                    msg = f"stopped after {steps} model calls (the step limit); ask to continue if needed"
                    self._emit(Notice("step_limit", msg))
                    self.session.record_event("notice", kind="step_limit", message=msg)
                    break
                notice = await self._compactor.run(self.tools.openai_tools())
                if notice is not None:
                    self._emit(notice)
                steps += 1
                step = await self._model_step()
                if step.done is not None:
                    turn_usage.add(step.done.usage)
                    self.session.record_usage(step.done.usage)
                calls = self._record_assistant(step)
                if step.done is not None and step.done.finish_reason == "error" and not step.interrupted:
                    error = step.done.error or "the model backend failed"
                    self._emit(AgentError(error))
                    self.session.record_event("error", message=error)
                    for call in calls:  # never leave a call without a result
                        self._emit(ToolCallStarted(call.call_id, call.name, call.parsed))
                        self._finish_call(call, _Outcome(False, "Error: not run, the model backend failed"))
                    reason = "error"
                    break
                if step.interrupted:
                    for call in calls:
                        self._emit(ToolCallStarted(call.call_id, call.name, call.parsed))
                        self._finish_call(call, _Outcome(False, INTERRUPTED_RESULT, interrupted=True))
                    reason = "interrupted"
                    break
                for message in step.errors:
                    self._emit(Notice("malformed_output", message))
                    self.session.record_event("notice", kind="malformed_output", message=message)
                if calls:
                    await self._run_calls(calls, step.errors)
                    continue
                if step.errors:
                    self.session.add_message({"role": "user", "content": _malformed_feedback(step.errors)})
                    continue
                reason = "done"
                break
        except Exception as e:  # a bug here must still end the turn cleanly for the UI
            error = f"{type(e).__name__}: {e}"
            reason = "error"
            self._emit(AgentError(error))
            self.session.record_event("error", message=error)
            self._repair_history()
        if reason == "interrupted":
            self.session.record_event("interrupted")
        try:
            context_tokens = await self.acontext_tokens()
        except Exception:
            context_tokens = 0
        self._emit(
            TurnFinished(reason, turn_usage, steps, context_tokens, self.client.context_window, error=error)
        )
        self._emit(_END)

    # -- one model call ------------------------------------------------------------------------------

    def _request_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt()}, *self.session.messages]

    async def _request(self) -> ChatRequest:
        messages = self._request_messages()
        tools = self.tools.openai_tools()
        prompt_tokens = await asyncio.to_thread(self.client.count_tokens, messages, tools)
        room = self.client.context_window - prompt_tokens
        return ChatRequest(
            messages=messages,
            tools=tools,
            max_tokens=max(1, min(self.config.max_tokens, room - 1)),
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=self.config.seed,
        )

    async def _model_step(self) -> _Step:
        step = _Step()
        stream = self.client.stream(await self._request())

        async def consume() -> None:
            async for ev in stream:
                if isinstance(ev, TextDelta):
                    step.text.append(ev.text)
                    self._emit(ev)
                elif isinstance(ev, ReasoningDelta):
                    step.reasoning.append(ev.text)
                    self._emit(ev)
                elif isinstance(ev, ToolCallReady):
                    step.calls.append(ev)
                elif isinstance(ev, MalformedOutput):
                    step.errors.append(ev.message)
                elif isinstance(ev, ModelDone):
                    step.done = ev
                elif isinstance(ev, ToolCallBegin):
                    pass  # progress only; the call is acted on when it is complete

        consumer = asyncio.create_task(consume())
        assert self._stop is not None
        stopper = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({consumer, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not consumer.done():
                step.interrupted = True
                consumer.cancel()
            try:
                await consumer
            except asyncio.CancelledError:
                pass
            except Exception as e:  # a client that raises instead of reporting ModelDone(error)
                step.done = ModelDone("error", Usage(), f"{type(e).__name__}: {e}")
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
        if step.done is None and not step.interrupted:
            step.done = ModelDone("error", Usage(), "the model stream ended without finishing")
        if step.done is not None and step.done.finish_reason == "cancelled":
            step.interrupted = True
        return step

    def _record_assistant(self, step: _Step) -> list[_Call]:
        """Add the assistant message (text, reasoning, complete tool calls) and give the calls ids."""
        text, reasoning = "".join(step.text), "".join(step.reasoning)
        calls: list[_Call] = []
        for ready in step.calls:
            self._call_seq += 1
            try:
                parsed: dict[str, Any] | str = json.loads(ready.arguments) if ready.arguments.strip() else {}
            except (ValueError, RecursionError):  # the registry refuses it with a clear message
                parsed = ready.arguments
            calls.append(_Call(f"call_{self._call_seq}", ready.name, ready.arguments or "{}", parsed))
        if not (text or reasoning or calls):
            return calls
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        self.session.add_message(message)
        return calls

    # -- tool calls ------------------------------------------------------------------------------------

    def _is_read(self, name: str) -> bool:
        return self._kinds.get(name) is ToolKind.READ

    async def _run_calls(self, calls: list[_Call], parse_errors: list[str]) -> None:
        """Run the calls of one step: consecutive reads together, everything else alone, in order."""
        groups: list[list[_Call]] = []
        for call in calls:
            if groups and self._is_read(call.name) and all(self._is_read(c.name) for c in groups[-1]):
                groups[-1].append(call)
            else:
                groups.append([call])
        outcomes: dict[str, _Outcome] = {}
        for group in groups:
            if self._interrupted.is_set():
                for call in group:
                    self._emit(ToolCallStarted(call.call_id, call.name, call.parsed))
                    outcomes[call.call_id] = _Outcome(False, INTERRUPTED_RESULT, interrupted=True)
                continue
            for call in group:
                self._emit(ToolCallStarted(call.call_id, call.name, call.parsed))
            outcomes.update(await self._run_group(group))
        if parse_errors and calls:  # the model must also hear about the calls that did not parse
            last = outcomes[calls[-1].call_id]
            last.output += "\n\n" + _malformed_feedback(parse_errors)
        for call in calls:
            self._finish_call(call, outcomes[call.call_id])

    async def _run_group(self, group: list[_Call]) -> dict[str, _Outcome]:
        limit = asyncio.Semaphore(max(1, self.config.parallel_reads))

        async def one(call: _Call) -> _Outcome:
            async with limit:
                if self._interrupted.is_set():
                    return _Outcome(False, INTERRUPTED_RESULT, interrupted=True)
                return await asyncio.to_thread(self._execute, call)

        tasks = {call.call_id: asyncio.create_task(one(call)) for call in group}
        assert self._stop is not None
        stopper = asyncio.create_task(self._stop.wait())
        everything = asyncio.gather(*tasks.values(), return_exceptions=True)
        await asyncio.wait({everything, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not everything.done():
            # Interrupted: a shell command is being killed (cancel event); give running calls a
            # moment to report their real outcome, then abandon the rest (threads cannot be killed).
            await asyncio.wait(tasks.values(), timeout=self.config.interrupt_grace_s)
        out: dict[str, _Outcome] = {}
        for call_id, task in tasks.items():
            if not task.done():
                task.cancel()
                out[call_id] = _Outcome(False, ABANDONED_RESULT, interrupted=True)
            elif task.cancelled():
                out[call_id] = _Outcome(False, INTERRUPTED_RESULT, interrupted=True)
            elif task.exception() is not None:
                exc = task.exception()
                out[call_id] = _Outcome(False, f"Error: {type(exc).__name__}: {exc}", error=str(exc))
            else:
                out[call_id] = task.result()
        if not everything.done():
            everything.cancel()
            with contextlib.suppress(BaseException):
                await everything
        return out

    def _execute(self, call: _Call) -> _Outcome:
        """On a worker thread: run one call through the registry (validation, policy, approval)."""
        self._tls.call_id = call.call_id
        t0 = time.monotonic()
        try:
            result = self.tools.execute(call.name, call.parsed)
        finally:
            self._tls.call_id = None
        text, truncated = ctx.truncate_output(result.for_model(), self.config.max_tool_output_chars)
        diff = result.meta.get("diff") if isinstance(result.meta.get("diff"), str) else None
        return _Outcome(
            ok=result.ok,
            output=text,
            error=result.error,
            denied=result.denied,
            truncated=truncated,
            diff=diff,
            duration_s=time.monotonic() - t0,
            meta=dict(result.meta),
        )

    def _finish_call(self, call: _Call, outcome: _Outcome) -> None:
        """Put the result in the history and on record, and tell the UI."""
        self.session.add_message({"role": "tool", "tool_call_id": call.call_id, "content": outcome.output})
        self.session.record_tool_call(
            call.call_id,
            call.name,
            call.parsed,
            ok=outcome.ok,
            output=outcome.output,
            error=outcome.error,
            denied=outcome.denied,
            interrupted=outcome.interrupted,
            duration_s=outcome.duration_s,
            meta=outcome.meta,
        )
        if outcome.truncated:
            msg = f"output of {call.name} ({call.call_id}) was shortened to {self.config.max_tool_output_chars} characters"
            self._emit(Notice("output_truncated", msg))
        self._emit(
            ToolCallFinished(
                call.call_id,
                call.name,
                ok=outcome.ok,
                output=outcome.output,
                error=outcome.error,
                denied=outcome.denied,
                interrupted=outcome.interrupted,
                diff=outcome.diff,
                truncated=outcome.truncated,
                duration_s=round(outcome.duration_s, 4),
                meta=outcome.meta,
            )
        )

    # -- permissions -------------------------------------------------------------------------------

    def _approve(self, request: ApprovalRequest) -> ApprovalResponse:
        """The registry's approver (runs on a tool worker thread): ask the UI and wait for the answer."""
        call_id = getattr(self._tls, "call_id", None) or ""
        if self._interrupted.is_set() or self._loop is None:
            return ApprovalResponse(Decision.DENY, message="the user interrupted the turn")
        event = ApprovalRequested(call_id, request)
        with self._pending_lock:
            self._pending.add(event)
        try:
            self._emit_threadsafe(event)
            if self._interrupted.is_set():  # raced with interrupt(): it may have missed this one
                event.answer(ApprovalResponse(Decision.DENY, message="the user interrupted the turn"))
            response: ApprovalResponse = event._future.result()
        finally:
            with self._pending_lock:
                self._pending.discard(event)
        rule = response.rule or request.suggested_rule
        self.session.record_permission(
            call_id,
            request.tool,
            response.decision.value,
            reason=request.reason,
            rule=rule.describe() if rule is not None and response.decision is Decision.ALLOW_ALWAYS else None,
            message=response.message,
        )
        return response

    def _on_audit(self, entry: AuditEntry) -> None:
        """Every registry decision (policy, rule, user, validation) goes on the session's record too."""
        call_id = getattr(self._tls, "call_id", None)
        if call_id is None:
            return  # a call made outside this agent's turn (another user of the registry)
        with contextlib.suppress(Exception):  # recording must never break a tool call
            self.session.record_event(
                "tool_decision",
                call_id=call_id,
                tool=entry.tool,
                kind=entry.kind,
                decision=entry.decision,
                decided_by=entry.decided_by,
                sandboxed=entry.sandboxed,
            )

    def _repair_history(self) -> None:
        """After an unexpected error: give any tool call without a result an 'interrupted' one."""
        answered = {m.get("tool_call_id") for m in self.session.messages if m.get("role") == "tool"}
        for m in list(self.session.messages):
            for c in m.get("tool_calls") or []:
                if c["id"] not in answered:
                    self.session.add_message(
                        {"role": "tool", "tool_call_id": c["id"], "content": INTERRUPTED_RESULT}
                    )


def _malformed_feedback(errors: list[str]) -> str:
    listed = "\n".join(f"- {e}" for e in errors)
    return (
        "Your last message could not be used as written:\n"
        f"{listed}\n"
        "Reply again: answer in plain text, or call a tool with a JSON object of arguments."
    )
