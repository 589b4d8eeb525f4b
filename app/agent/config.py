"""Agent settings: limits on steps, tokens and tool output, and when to compact."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AgentConfig:
    max_steps: int = 50  # model calls per user turn before the loop stops (step_limit)
    max_tokens: int = 4096  # answer tokens per model call (clamped to what fits the context)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tool_output_chars: int = 30_000  # longer tool output keeps its head and tail
    compact_at: float = 0.80  # compact when the prompt would exceed this share of the context
    keep_recent_turns: int = 2  # user turns kept verbatim by compaction
    parallel_reads: int = 8  # read-only tool calls of one step run concurrently, up to this many
    system_prompt: str | None = None  # replaces the built-in instructions (environment still added)
    include_agents_md: bool = True  # add the project's AGENTS.md to the system prompt
    interrupt_grace_s: float = 2.0  # on interrupt, how long running tool calls may take to report
