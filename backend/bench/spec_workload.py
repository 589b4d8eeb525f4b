"""A code-editing workload for speculative decoding: a file is read into the prompt and the model
is asked to write it back with a change (tests/backend/spec/fixtures/edit_workload holds the file
and the turns). Each turn runs through the engine three times: without speculation, with the
n-gram drafter, and with an oracle drafter whose drafts are the plain run's own greedy
continuation (every draft right: the mechanism's upper bound at this k). The three must emit the
same tokens; the report gives tokens per verify step and the acceptance rate of each mode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mkcode.backend.engine.engine import Engine
from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.sampling import SamplingParams


@dataclass
class EditTurn:
    path: str
    instruction: str
    content: str

    def text(self) -> str:
        return f"Here is `{self.path}`:\n```python\n{self.content}```\n\n{self.instruction}\n\n```python\n"


def load_turns(fixture_dir: Path) -> list[EditTurn]:
    """The turns of a workload directory: `turns.json` (instructions) over its one source file."""
    sources = sorted(p for p in fixture_dir.iterdir() if p.suffix == ".py")
    if len(sources) != 1:
        raise ValueError(f"{fixture_dir}: expected one .py source file, found {len(sources)}")
    src = sources[0]
    turns = json.loads((fixture_dir / "turns.json").read_text())
    return [EditTurn(src.name, t["instruction"], src.read_text()) for t in turns]


def byte_tokens(text: str, vocab_size: int) -> list[int]:
    """Token ids for a model without a tokenizer: UTF-8 bytes (vocab_size must exceed 255)."""
    if vocab_size < 256:
        raise ValueError(f"byte tokens need a vocabulary of 256, the model has {vocab_size}")
    return list(text.encode())


class OracleDrafter:
    """Drafts from a known continuation of the prompt (the plain run's greedy output)."""

    def __init__(self, prompt_len: int, continuation: Sequence[int]):
        self.prompt_len, self.continuation = prompt_len, list(continuation)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        g = len(tokens) - self.prompt_len
        return self.continuation[g : g + k]


@dataclass
class ModeReport:
    mode: str
    tokens: int  # decode tokens (after each request's first, which prefill samples)
    sequence_steps: int
    verify_steps: int
    draft_tokens: int
    accepted_tokens: int

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.sequence_steps if self.sequence_steps else 0.0

    @property
    def tokens_per_verify(self) -> float:
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def line(self) -> str:
        return (
            f"{self.mode:>7}: {self.tokens} decode tokens in {self.sequence_steps} sequence-steps "
            f"({self.tokens_per_step:.2f} tokens/step); {self.verify_steps} verify steps, "
            f"{self.accepted_tokens}/{self.draft_tokens} drafts accepted ({100 * self.acceptance_rate:.0f} %), "
            f"{self.tokens_per_verify:.2f} tokens per verify step"
        )


@dataclass
class WorkloadReport:
    prompt_tokens: list[int]
    outputs: list[list[int]]
    modes: dict[str, ModeReport]

    def lines(self) -> list[str]:
        head = f"{len(self.outputs)} turns, prompts of {min(self.prompt_tokens)}-{max(self.prompt_tokens)} tokens"
        return [head] + [m.line() for m in self.modes.values()]


def run_workload(
    make_engine: Callable[[str, Callable | None], Engine],
    prompts: list[list[int]],
    max_tokens: int,
) -> WorkloadReport:
    """`make_engine(speculative, drafter_factory)` builds a fresh engine (the factory maps a request
    id to its drafter; None: the engine's own); each mode runs every
    prompt at once (greedy, EOS honoured). Raises if a mode's tokens differ from the plain run's."""
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs: list[list[int]] = []
    modes: dict[str, ModeReport] = {}
    for mode in ("off", "ngram", "oracle"):
        factory = None
        if mode == "oracle":
            factory = {
                f"turn-{i}": OracleDrafter(len(p), outputs[i]) for i, p in enumerate(prompts)
            }.__getitem__
        engine = make_engine(
            "off" if mode == "off" else "ngram", factory and (lambda req, f=factory: f(req.request_id))
        )
        streams = [
            engine.submit(GenerationRequest(list(p), sp, request_id=f"turn-{i}"))
            for i, p in enumerate(prompts)
        ]
        engine.run_until_idle()
        got = [s.result().token_ids for s in streams]
        if mode == "off":
            outputs = got
        elif got != outputs:
            bad = next(i for i, (a, b) in enumerate(zip(got, outputs)) if a != b)
            raise AssertionError(f"{mode}: turn {bad} differs from the plain run")
        st = engine.stats
        modes[mode] = ModeReport(
            mode,
            st.decode_tokens_total,
            st.decode_sequence_steps,
            st.spec_verify_steps,
            st.spec_draft_tokens,
            st.spec_accepted_tokens,
        )
    return WorkloadReport([len(p) for p in prompts], outputs, modes)
