"""The engine: owns requests and KV memory; schedules chunked prefill and batched decode.

Life of a request: submit → waiting → (admitted: prefix-cache pages adopted, pages for its first
chunk reserved) prefilling, chunk by chunk → decoding, one token per step in a batch of up to the
backend's maximum → finished (pages released). Under KV pressure the youngest running request is
preempted: its pages are freed now and it is recomputed later from its tokens (prompt + generated),
so preemption never changes its output.

Speculative decoding (`EngineOptions.speculative = "ngram"`): a decode-ready sequence whose recent
tokens occurred earlier in it gets up to k drafts (backend.spec.drafter); its last token and the
drafts run as k+1 rows of the same decode step at positions L..L+k over its block table, and the
rows are read in order (backend.spec.acceptance): each accepted token is emitted as it is accepted,
and the step ends at the first token that differs from its draft (or at a stop). The rejected rows'
pages are unmapped (`SequenceKV.trim`); their K/V lies past the sequence's length, where nothing
reads it and the next step overwrites it. Drafts are never appended to `tokens`, so prefix-cache
keys, window releases and preemption only ever see accepted tokens.

Invariants kept per sequence: `num_computed` tokens have KV in the cache; a decode-ready sequence
has num_computed == len(tokens) - 1 (its last sampled token is fed next). All engine state is
touched by one thread (the engine thread, or the caller of `step()` when run without one); other
threads talk to it through `submit` and `cancel`, which only enqueue.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from mkcode.backend.engine.decode_backend import DecodeBackend, DecodeBatch
from mkcode.backend.engine.request import (
    FinishEvent,
    FinishReason,
    GenerationRequest,
    RequestError,
    RequestStream,
    SpecUsage,
    TokenEvent,
    Usage,
)
from mkcode.backend.engine.text import Detokenizer, TextAssembler
from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.kv.sequence import SequenceKV
from mkcode.backend.model.reference import ReferenceModel, Segment
from mkcode.backend.sampling import sample_token
from mkcode.backend.spec.acceptance import accept_drafts
from mkcode.backend.spec.drafter import MAX_DRAFTS, AdaptiveK, Drafter, DrafterConfig, NgramDrafter
from mkcode.backend.spec.policy import choose_draft_counts

PROBE_EVERY = 8  # a sequence whose drafts the cost policy declined this often verifies one anyway

SPECULATIVE_MODES = ("off", "ngram")


@dataclass
class EngineOptions:
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_prefill_tokens: int = 512  # prefill tokens per engine step (chunk budget)
    max_running: int = 64  # sequences admitted at once
    enable_prefix_cache: bool = True
    speculative: str = "ngram"  # "off" | "ngram" (prompt-lookup drafts verified in the decode step)
    spec_k: int = MAX_DRAFTS  # most drafts per sequence and step (1..7); adapted down per sequence
    spec_drafter: DrafterConfig = field(default_factory=DrafterConfig)

    def __post_init__(self) -> None:
        if self.speculative not in SPECULATIVE_MODES:
            raise ValueError(
                f"speculative must be one of {', '.join(SPECULATIVE_MODES)}; got {self.speculative!r}"
            )
        if (
            isinstance(self.spec_k, bool)
            or not isinstance(self.spec_k, int)
            or not 1 <= self.spec_k <= MAX_DRAFTS
        ):
            raise ValueError(f"spec_k must be an integer in [1, {MAX_DRAFTS}]; got {self.spec_k!r}")


@dataclass
class EngineMetrics:
    running: int = 0
    waiting: int = 0
    kv_pages_total: int = 0
    kv_pages_used: int = 0
    kv_tokens_capacity: int = 0
    prefix_hit_rate: float = 0.0
    prompt_tokens_total: int = 0
    decode_tokens_total: int = 0
    prompt_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    preemptions: int = 0
    requests_finished: int = 0
    decode_sequence_steps: int = (
        0  # (sequence, decode step) pairs; decode_tokens_total / this = tokens a step
    )
    spec_verify_steps: int = 0  # sequence-steps that carried drafts
    spec_draft_tokens: int = 0  # drafts verified
    spec_accepted_tokens: int = 0  # drafts accepted

    @property
    def kv_usage(self) -> float:
        return self.kv_pages_used / self.kv_pages_total if self.kv_pages_total else 0.0

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_tokens_per_verify(self) -> float:
        """Tokens a sequence-step with drafts emitted on average (accepted drafts + 1)."""
        steps = self.spec_verify_steps
        return (self.spec_accepted_tokens + steps) / steps if steps else 0.0


@dataclass(eq=False)  # identity semantics: `seq in list` must not compare fields
class _Seq:
    req: GenerationRequest
    stream: RequestStream
    tokens: list[int]
    prompt_len: int
    max_new: int
    kv: SequenceKV
    text: TextAssembler
    generator: torch.Generator
    order: int
    keys: list[bytes] = field(default_factory=list)
    num_computed: int = 0
    generated: int = 0
    cached_tokens: int = 0
    drafter: Drafter | None = None  # None: this sequence does not speculate
    spec_k: AdaptiveK | None = None
    spec: SpecUsage = field(default_factory=lambda: SpecUsage())

    @property
    def prefill_target(self) -> int:
        """Tokens whose KV prefill must produce before decoding (the last sampled token excluded)."""
        return len(self.tokens) - 1 if self.generated else len(self.tokens)

    @property
    def decode_ready(self) -> bool:
        return self.generated > 0 and self.num_computed == len(self.tokens) - 1


class _Rate:
    """Tokens per second over a sliding window of recent steps."""

    def __init__(self, window_s: float = 5.0):
        self.window_s = window_s
        self.samples: deque[tuple[float, int, float]] = deque()

    def add(self, n: int, seconds: float) -> None:
        now = time.monotonic()
        self.samples.append((now, n, seconds))
        while self.samples and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    @property
    def value(self) -> float:
        busy = sum(s for _, _, s in self.samples)
        return sum(n for _, n, _ in self.samples) / busy if busy > 0 else 0.0


class Engine:
    def __init__(
        self,
        model: ReferenceModel,
        pool: KVPool,
        decode_backend: DecodeBackend,
        *,
        options: EngineOptions | None = None,
        eos_token_ids: tuple[int, ...] = (),
        detokenizer_factory: Callable[[], Detokenizer] | None = None,
        prefill_fn: Callable[[torch.Tensor, torch.Tensor, list[Segment]], torch.Tensor] | None = None,
        drafter_factory: Callable[[GenerationRequest], Drafter] | None = None,
    ):
        self.model = model
        self.cfg = model.cfg
        self.pool = pool
        self.backend = decode_backend
        self.opts = options or EngineOptions()
        self.max_model_len = min(
            self.opts.max_model_len or self.cfg.max_position_embeddings, self.cfg.max_position_embeddings
        )
        # a backend whose block tables hold at most `max_pages` pages per sequence bounds the
        # context too: sequences (and their verify rows) end at "length" there instead of the
        # backend refusing the step
        backend_pages = getattr(decode_backend, "max_pages", None)
        if backend_pages:
            self.max_model_len = min(self.max_model_len, backend_pages * PAGE_SIZE)
        self.eos = set(eos_token_ids or self.cfg.eos_token_ids)
        self.detok_factory = detokenizer_factory
        self.prefill_fn = prefill_fn or model.forward
        # one drafter per request (default: the n-gram prompt lookup; benchmarks pass an oracle)
        self.drafter_factory = drafter_factory or (lambda _req: NgramDrafter(self.opts.spec_drafter))
        self.device = model.device
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []  # admitted: prefilling or decoding, in admission order
        self._inbox: deque[_Seq] = deque()
        self._cancels: deque[str] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._order = 0
        self._thread: threading.Thread | None = None
        self._stop = False
        self._prompt_rate, self._decode_rate = _Rate(), _Rate()
        self.stats = EngineMetrics(kv_pages_total=pool.num_pages, kv_tokens_capacity=pool.tokens_capacity)
        self._worst_case_pages_checked = self._worst_case_pages(self.max_model_len)
        self.speculative = self.opts.speculative
        # relative step time by rows, when the backend knows it (None: rows cost about the same)
        self._row_cost: Callable[[int], float] | None = getattr(decode_backend, "row_cost", None)
        if self.speculative != "off" and not getattr(decode_backend, "verify_rows", False):
            name = getattr(decode_backend, "name", type(decode_backend).__name__)
            self.speculative = "off"
            note = getattr(decode_backend, "verify_rows_note", None)  # why not, where the backend says
            self.spec_note = f"speculation off: the {name} decode backend runs no verify rows" + (
                f" ({note})" if note else ""
            )
        else:
            self.spec_note = f"speculation: {self.speculative}" + (
                f", k <= {self.opts.spec_k}" if self.speculative != "off" else ""
            )

    # ---- public API (any thread) ---------------------------------------------------------------

    def submit(self, req: GenerationRequest) -> RequestStream:
        """Queue a request; returns its event stream. Bad requests raise RequestError here."""
        n = len(req.prompt_ids)
        if any(t < 0 or t >= self.cfg.vocab_size for t in req.prompt_ids):
            raise RequestError(f"prompt token ids must be in [0, {self.cfg.vocab_size})")
        if n >= self.max_model_len:
            raise RequestError(
                f"prompt of {n} tokens does not fit the context of {self.max_model_len} tokens "
                "(at least one token must remain for the answer)"
            )
        if self._worst_case_pages(n + 1) > self.pool.num_pages:
            raise RequestError(
                f"prompt of {n} tokens needs more KV pages than the pool holds ({self.pool.num_pages}); "
                "raise the KV memory budget"
            )
        max_new = min(req.sampling.max_tokens, self.max_model_len - n)  # clamped, not refused
        stream = RequestStream(req.request_id, self.cancel)
        seq = _Seq(
            req=req,
            stream=stream,
            tokens=list(req.prompt_ids),
            prompt_len=n,
            max_new=max_new,
            kv=SequenceKV(self.cfg),
            text=TextAssembler(self.detok_factory() if self.detok_factory else None, req.sampling.stop),
            generator=req.sampling.make_generator(self.device),
            order=0,
        )
        if self.speculative == "ngram" and req.constraint is None:  # a grammar cannot take back tokens
            seq.drafter = self.drafter_factory(req)
            seq.spec_k = AdaptiveK(self.opts.spec_k)
        with self._wake:
            self._inbox.append(seq)
            self._wake.notify()
        return stream

    def cancel(self, request_id: str) -> None:
        with self._wake:
            self._cancels.append(request_id)
            self._wake.notify()

    def metrics(self) -> EngineMetrics:
        return self.stats

    def start(self) -> Engine:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="mkcode-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._inbox or self._cancels or self._waiting or self._running)

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Drive the engine on the calling thread until no request is left (for tests and CLIs)."""
        for _ in range(max_steps):
            if not self.has_work():
                return
            self.step()
        raise RuntimeError(f"engine still busy after {max_steps} steps")

    def check_accounting(self) -> None:
        """Page accounting must be exact: refcounts == references held (tests call this)."""
        self.pool.check([s.kv.tables for s in self._running])

    # ---- engine thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not (self._inbox or self._cancels or self._waiting or self._running):
                    self._wake.wait()
                if self._stop:
                    break
            self.step()
        self._fail_all("engine shut down")

    def step(self) -> None:
        """One scheduling step: intake, cancellations, admission, one prefill chunk batch, one
        decode step over every decode-ready sequence."""
        with self._lock:
            while self._inbox:
                seq = self._inbox.popleft()
                self._order += 1
                seq.order = self._order
                self._waiting.append(seq)
            cancels = list(self._cancels)
            self._cancels.clear()
        for rid in cancels:
            self._cancel_now(rid)
        try:
            self._admit()
            progressed = self._prefill_step()
            progressed |= self._decode_step()
            if not progressed and self._running:
                # every admitted sequence is blocked on pages held by the others: free the youngest
                self._preempt(self._running[-1])
        except Exception as e:  # a failed step fails its requests, never the engine
            self._fail_all(f"{type(e).__name__}: {e}")
        self._update_metrics()

    # ---- scheduling ----------------------------------------------------------------------------

    def _worst_case_pages(self, num_tokens: int) -> int:
        blocks = (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        chunk_blocks = (self.opts.max_prefill_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        total = 0
        for layer in range(self.cfg.num_hidden_layers):
            w = self.cfg.window(layer)
            total += blocks if w is None else min(blocks, (w + PAGE_SIZE - 1) // PAGE_SIZE + chunk_blocks + 1)
        return total

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.opts.max_running:
            seq = self._waiting[0]
            target = seq.prefill_target
            max_blocks = (target - 1) // PAGE_SIZE
            seq.keys = self.pool.prefix_keys(seq.tokens, seq.keys)  # hashed once while it waits
            entries = self.pool.match_prefix(seq.keys, max_blocks)
            seq.kv.adopt_prefix(self.pool, entries)
            seq.num_computed = len(entries) * PAGE_SIZE
            first_end = min(target, seq.num_computed + self.opts.max_prefill_tokens)
            need = seq.kv.pages_needed(first_end)
            if self._running:  # leave one block of headroom for the sequences already running
                need += self.cfg.num_hidden_layers
            if not self.pool.ensure_free(need):
                seq.kv.free_all(self.pool)
                seq.num_computed = 0
                break
            if seq.generated == 0:
                seq.cached_tokens = seq.num_computed
            self.pool.record_prefix_lookup(min(len(seq.keys), max_blocks), len(entries))
            self._waiting.popleft()
            self._running.append(seq)
            seq.kv.release_outside_window(self.pool, seq.num_computed)

    def _prefill_step(self) -> bool:
        budget = self.opts.max_prefill_tokens
        chunks: list[tuple[_Seq, int, int]] = []
        for seq in list(self._running):
            if budget <= 0:
                break
            if seq.num_computed >= seq.prefill_target:
                continue
            start = seq.num_computed
            end = min(seq.prefill_target, start + budget)
            if not self.pool.ensure_free(seq.kv.pages_needed(end)):
                continue
            seq.kv.ensure_capacity(self.pool, end)
            chunks.append((seq, start, end))
            budget -= end - start
        if not chunks:
            return False
        ids, pos, segments, off = [], [], [], 0
        for seq, start, end in chunks:
            ids += seq.tokens[start:end]
            pos += range(start, end)
            segments.append(Segment(off, off + end - start, seq.kv.view(self.pool)))
            off += end - start
        t0 = time.perf_counter()
        logits = self.prefill_fn(
            torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device), segments
        )
        for i, (seq, _start, end) in enumerate(chunks):
            seq.num_computed = end
            self._after_compute(seq)
            if end == seq.prefill_target and seq.generated == 0:
                self._accept(seq, self._sample(seq, logits[i]))
        self._sync()
        self._prompt_rate.add(off, time.perf_counter() - t0)
        self.stats.prompt_tokens_total += off
        return True

    def _drafts(self, seq: _Seq) -> list[int]:
        """Drafts for this step's verify rows: none when the sequence does not speculate, nothing
        matches, or no token may follow the next one (max_tokens, the context)."""
        if seq.drafter is None or seq.spec_k is None:
            return []
        room = min(seq.max_new - seq.generated - 1, self.max_model_len - len(seq.tokens))
        # with a cost model the policy picks the count; without one, the adaptive k
        k = seq.spec_k.k_max if self._row_cost is not None else seq.spec_k.k
        k = min(k, room, self.backend.max_batch - 1)
        return seq.drafter.propose(seq.tokens, k) if k > 0 else []

    def _fit_rows(self, plan: list[tuple[_Seq, list[int]]]) -> None:
        """Trim drafts so that the step stays one backend call: no drafts when the sequences alone
        fill more than one call; where the backend gives its step time by rows (`row_cost`), the
        counts that maximise expected tokens per step time (backend.spec.policy), with one draft
        verified now and then for a sequence whose drafts keep being declined; else the longest
        draft lists lose a token until the rows fit."""
        limit = self.backend.max_batch
        if len(plan) > limit:
            for _, drafts in plan:
                drafts.clear()
            return
        if self._row_cost is not None and any(d for _, d in plan):
            alphas = [s.spec_k.alpha if s.spec_k is not None else 0.0 for s, _ in plan]
            counts = choose_draft_counts(alphas, [len(d) for _, d in plan], self._row_cost, limit)
            for (seq, drafts), n in zip(plan, counts):
                if drafts and n == 0 and seq.spec_k is not None:
                    seq.spec_k.skipped += 1
                    if seq.spec_k.skipped >= PROBE_EVERY:
                        seq.spec_k.skipped, n = 0, 1
                del drafts[n:]
        rows = sum(1 + len(d) for _, d in plan)
        while rows > limit:
            longest = max(plan, key=lambda p: len(p[1]))[1]
            longest.pop()
            rows -= 1

    def _decode_step(self) -> bool:
        ready = [s for s in self._running if s.decode_ready]
        plan: list[tuple[_Seq, list[int]]] = [(s, self._drafts(s)) for s in ready]
        self._fit_rows(plan)
        batch: list[tuple[_Seq, list[int]]] = []
        for seq, drafts in plan:
            if seq not in self._running:  # preempted below for an older sequence
                continue
            if drafts and not self.pool.ensure_free(seq.kv.pages_needed(len(seq.tokens) + len(drafts))):
                drafts.clear()  # drafts never preempt anyone
            while not self.pool.ensure_free(seq.kv.pages_needed(len(seq.tokens))):
                victim = self._running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq not in self._running:
                continue
            seq.kv.ensure_capacity(self.pool, len(seq.tokens) + len(drafts))
            batch.append((seq, drafts))
        batch = [(s, d) for s, d in batch if s in self._running]
        if not batch:
            return False
        t0 = time.perf_counter()
        emitted = 0
        calls: list[list[tuple[_Seq, list[int]]]] = [[]]
        rows = 0
        for item in batch:  # a sequence's rows never straddle two calls
            n = 1 + len(item[1])
            if rows + n > self.backend.max_batch:
                calls.append([])
                rows = 0
            calls[-1].append(item)
            rows += n
        for part in calls:
            logits = self.backend.decode(self._decode_batch(part))
            greedy = logits.argmax(dim=-1).tolist()  # one device sync for every greedy row
            r = 0
            for seq, drafts in part:
                emitted += self._verify(seq, drafts, logits, greedy, r)
                r += 1 + len(drafts)
        self._sync()
        self._decode_rate.add(emitted, time.perf_counter() - t0)
        self.stats.decode_tokens_total += emitted
        self.stats.decode_sequence_steps += len(batch)
        return True

    def _verify(self, seq: _Seq, drafts: list[int], logits: torch.Tensor, greedy: list[int], r0: int) -> int:
        """Accept what rows r0..r0+len(drafts) of the step give this sequence; returns the tokens
        emitted. Row i's K/V is kept only when every draft before it was accepted."""
        L = len(seq.tokens) - 1  # position of row 0 (the fed token)
        plain_greedy = seq.req.sampling.greedy and seq.req.constraint is None

        def token_of_row(i: int) -> int:
            return greedy[r0 + i] if plain_greedy else self._sample(seq, logits[r0 + i])

        def emit(i: int, token: int) -> bool:
            seq.num_computed = L + i + 1  # rows 0..i hold the sequence's own tokens
            self._after_compute(seq)
            self._accept(seq, token)
            return seq.stream.finished

        out = accept_drafts(drafts, token_of_row, emit)
        if drafts:
            seq.spec.verify_steps += 1
            seq.spec.draft_tokens += len(drafts)
            seq.spec.accepted_tokens += out.accepted
            self.stats.spec_verify_steps += 1
            self.stats.spec_draft_tokens += len(drafts)
            self.stats.spec_accepted_tokens += out.accepted
            if seq.spec_k is not None:
                seq.spec_k.update(len(drafts), out.accepted)
            if not out.finished:  # as after a plain step: blocks for the computed positions only
                seq.kv.trim(self.pool, seq.num_computed)
        return len(out.emitted)

    def _decode_batch(self, part: list[tuple[_Seq, list[int]]]) -> DecodeBatch:
        L = self.cfg.num_hidden_layers
        width = max(s.kv.num_blocks for s, _ in part)
        n_rows = sum(1 + len(d) for _, d in part)
        tables = np.full((L, n_rows, width), NO_PAGE, dtype=np.int32)
        ids: list[int] = []
        positions: list[int] = []
        r = 0
        for s, drafts in part:
            n = 1 + len(drafts)
            tables[:, r : r + n, : s.kv.num_blocks] = s.kv.array[:, None, :]
            ids += [s.tokens[-1], *drafts]
            positions += range(len(s.tokens) - 1, len(s.tokens) - 1 + n)
            r += n
        dev = self.device
        spans = tuple(1 + len(d) for _, d in part)
        return DecodeBatch(
            token_ids=torch.tensor(ids, device=dev),
            positions=torch.tensor(positions, device=dev),
            block_tables=torch.from_numpy(tables).to(dev),
            kv_pool=self.pool.tensor,
            host_positions=tuple(positions),
            seq_rows=spans if n_rows > len(part) else None,
        )

    def _after_compute(self, seq: _Seq) -> None:
        if (len(seq.keys) + 1) * PAGE_SIZE <= seq.num_computed:
            seq.keys = self.pool.prefix_keys(seq.tokens[: seq.num_computed], seq.keys)
        seq.kv.register_full_blocks(self.pool, seq.keys, seq.num_computed)
        seq.kv.release_outside_window(self.pool, seq.num_computed)

    def _sample(self, seq: _Seq, logits: torch.Tensor) -> int:
        c = seq.req.constraint
        if c is not None:
            mask = c.allowed_tokens(logits.shape[-1])
            if mask is not None:
                mask = mask.to(logits.device)
                if not bool(mask.any()):
                    raise RuntimeError(f"constraint of {seq.req.request_id} allows no token")
                logits = logits.masked_fill(~mask, float("-inf"))
        tok = sample_token(logits, seq.req.sampling, seq.generator)
        if c is not None:
            c.advance(tok)
        return tok

    def _accept(self, seq: _Seq, token: int) -> None:
        seq.tokens.append(token)
        seq.generated += 1
        sp = seq.req.sampling
        reason: FinishReason | None = None
        is_stop_token = (token in self.eos and not sp.ignore_eos) or token in sp.stop_token_ids
        text = "" if is_stop_token else seq.text.push(token)
        constraint_done = seq.req.constraint is not None and seq.req.constraint.is_finished()
        if is_stop_token or seq.text.stopped or constraint_done:
            reason = "stop"
        elif seq.generated >= seq.max_new or len(seq.tokens) >= self.max_model_len:
            reason = "length"
        seq.stream.put(TokenEvent([token], text))
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: _Seq, reason: FinishReason, error: str | None = None) -> None:
        tail = seq.text.finish() if reason in ("stop", "length") else ""
        if tail:
            seq.stream.put(TokenEvent([], tail))
        seq.kv.free_all(self.pool)
        if seq in self._running:
            self._running.remove(seq)
        usage = Usage(
            prompt_tokens=seq.prompt_len,
            completion_tokens=seq.generated,
            cached_tokens=seq.cached_tokens,
            speculative=seq.spec if seq.drafter is not None else None,
        )
        seq.stream.put(FinishEvent(reason, usage, error))
        self.stats.requests_finished += 1

    def _preempt(self, seq: _Seq) -> None:
        """Free a running sequence's pages now; it is recomputed from its tokens later."""
        seq.kv.free_all(self.pool)
        seq.num_computed = 0
        self._running.remove(seq)
        self._waiting.appendleft(seq)
        self.stats.preemptions += 1

    def _cancel_now(self, request_id: str) -> None:
        for seq in list(self._running) + list(self._waiting):
            if seq.req.request_id == request_id and not seq.stream.finished:
                if seq in self._waiting:
                    self._waiting.remove(seq)
                self._finish(seq, "cancelled")
                return

    def _fail_all(self, message: str) -> None:
        for seq in list(self._running) + list(self._waiting):
            if seq in self._waiting:
                self._waiting.remove(seq)
            self._finish(seq, "error", message)
        with self._lock:
            pending = list(self._inbox)
            self._inbox.clear()
        for seq in pending:
            seq.stream.put(FinishEvent("error", Usage(prompt_tokens=seq.prompt_len), message))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _update_metrics(self) -> None:
        st = self.stats
        st.running = len(self._running)
        st.waiting = len(self._waiting) + len(self._inbox)
        st.kv_pages_used = self.pool.num_pages - self.pool.num_free
        st.prefix_hit_rate = self.pool.prefix_hit_rate
        st.prompt_tokens_per_s = self._prompt_rate.value
        st.decode_tokens_per_s = self._decode_rate.value
