"""Check what the demo model learned.

`tool_call_rate` decodes fresh training-style dialogues (a quick check the trainer reports).
`evaluate_checkpoint` is the held-out measure: scripted requests (list, read, grep, edit, run) in
phrasings and projects the trainer never generates, each in a fresh temporary workspace written to
disk, run as an agent loop: greedy decoding, the real mkcode tools executing every call, results fed
back, until the model answers in text. It counts

- correct tool choice: the first call is the tool the request needs (an edit may read first);
- grounded answers (list and read requests): the final answer exists and every file name in it
  is a file of the workspace (none invented);
- successful edits: the file on disk afterwards is exactly the requested change.

`evaluate_checkpoint(path, tool_set="codex")` (or "opencode") runs the same requests under a client's
tool vocabulary (`vocabularies.py`): the client's tool schemas and environment shape, its results
formats, and the calls executed through mkcode's registry (Codex's `exec_command` as a shell command).
A call counts as the right tool by what it does: under Codex, `ls` lists, `cat -n` reads, `grep`
searches and `sed -i` edits, and every shell command runs.

`write_report` puts the rates and every transcript's outline into REPORT.md beside the checkpoint.
`python -m mkcode.backend.demo.evaluate DIR [--tool-set codex]` prints the rates (and writes JSON or
a report with `--json` / `--markdown`).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A file name with an extension, a well-known one without (Makefile), or a directory written `name/`.
FILE_NAME = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.[A-Za-z][A-Za-z0-9]*|\b(?:Makefile|LICENSE|Dockerfile)\b|[A-Za-z0-9_][A-Za-z0-9_.-]*/"
)

# The trainer's dialogues never use these phrasings.
HELD_OUT_ASKS: dict[str, list[str]] = {
    "list": ["What files do we have?", "Show me the files in this project.", "list all files",
             "Which files are in the workspace?"],
    "read": ["Show me the contents of {path}.", "What's inside {path}?", "Display {path}.", "Look at {path}."],
    "grep": ["Where's {name} defined?", "In which file is {name} defined?", "Locate the function {name}.",
             "Find where {name} is."],
    "edit": ["Rename {name} to {new} in {path}, please.", "In {path}, please rename {name} to {new}.",
             "Change {name} to {new} in {path}.", "Rename the function {name} to {new} in {path}."],
    "run": ["Please run the tests.", "Run the unit tests.", "Show the git status.", "Run ls in the shell."],
}  # fmt: skip
# What the first call must do per kind, in the actions of `vocabularies.action_labels` (mkcode's set:
# list_dir, read_file, grep, read_file or edit_file, run_shell); an edit must also edit.
EXPECTED_ACTIONS: dict[str, set[str]] = {
    "list": {"list"},
    "read": {"read"},
    "grep": {"grep"},
    "edit": {"read", "edit"},
    "run": {"run"},
}


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


@dataclass
class Case:
    kind: str  # list | read | grep | edit | run
    request: str
    files: dict[str, str]
    edit: tuple[str, str, str] | None = None  # (path, old text, new text) the edit must make


@dataclass
class Outcome:
    case: Case
    calls: list[tuple[str, str]]  # (tool name, arguments JSON) in order
    answer: str
    right_tool: bool
    invented: list[str]  # file names in the answer that are not in the workspace
    edited: bool | None  # None: not an edit request

    @property
    def grounded(self) -> bool:
        return bool(self.answer.strip()) and not self.invented


@dataclass
class EvalResult:
    outcomes: list[Outcome]
    seconds: float
    version: str = ""
    counts: dict[str, Any] = field(default_factory=dict)
    tool_set: str = "mkcode"

    def rate(self, kinds: set[str], attr: str) -> tuple[int, int]:
        sel = [o for o in self.outcomes if o.case.kind in kinds]
        return sum(bool(getattr(o, attr)) for o in sel), len(sel)

    def rates(self) -> dict[str, tuple[int, int]]:
        all_kinds = set(EXPECTED_ACTIONS)
        invented = [o for o in self.outcomes if o.case.kind in {"list", "read"} and o.invented]
        n_lr = sum(o.case.kind in {"list", "read"} for o in self.outcomes)
        return {
            "correct tool choice": self.rate(all_kinds, "right_tool"),
            "grounded answers (list/read)": self.rate({"list", "read"}, "grounded"),
            "answers with an invented file name (list/read)": (len(invented), n_lr),
            "successful edits": self.rate({"edit"}, "edited"),
            **{f"correct tool choice: {k}": self.rate({k}, "right_tool") for k in EXPECTED_ACTIONS},
        }

    def summary(self) -> str:
        return "; ".join(f"{k} {a}/{b} ({100 * a / max(b, 1):.0f}%)" for k, (a, b) in self.rates().items())


def held_out_cases(seed: int = 9001, per_kind: int = 8) -> list[Case]:
    """Scripted requests over generated projects whose names the trainer's seed never drew (the
    made-up names are drawn from this seed), plus the project from the issue report."""
    from mkcode.backend.demo.dialogues import defined, func_name, make_project

    rng = random.Random(seed)
    cases: list[Case] = []
    for kind, asks in HELD_OUT_ASKS.items():
        for i in range(per_kind):
            if kind == "list" and i == 0:
                files = {
                    "README.md": "# demo\n",
                    "hello.py": 'def hello(name):\n    return "hi " + name\n',
                    "notes.txt": "notes\n",
                }
            else:
                files = make_project(rng).files
            proj_defs = defined(_Proj(files))
            path, _line, name = rng.choice(proj_defs)
            new = func_name(rng)
            while new == name or any(n == new for _, _, n in proj_defs):
                new = func_name(rng) + "_v2"
            ask = asks[i % len(asks)].format(path=path, name=name, new=new)
            edit = (path, f"def {name}(", f"def {new}(") if kind == "edit" else None
            cases.append(Case(kind, ask, files, edit))
    return cases


@dataclass
class _Proj:
    files: dict[str, str]

    def py_files(self) -> list[str]:
        return sorted(p for p in self.files if p.endswith(".py"))


def run_case(
    model: Any,
    tok: Any,
    case: Case,
    max_steps: int = 4,
    max_new: int = 160,
    instructions: str | None = None,
    tool_set: str = "mkcode",
) -> Outcome:
    """One request in a fresh workspace on disk, with mkcode's tools executing the calls;
    `instructions` replaces the short system prompt's instructions (a long agent prompt, say);
    `tool_set` ("opencode", "codex") offers that client's tools instead of mkcode's."""
    from mkcode.backend.chat.parser import parse_full
    from mkcode.backend.demo import vocabularies as vocab
    from mkcode.backend.demo.dialogues import system_prompt
    from mkcode.tools import ToolRegistry, Workspace

    with tempfile.TemporaryDirectory(prefix="mkcode-demo-eval-") as d:
        root = Path(d)
        for rel, text in case.files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        registry = ToolRegistry(Workspace(d), mode="full-auto")
        vrng = random.Random(f"{tool_set}-{case.request}")
        ts = vocab.tool_set(tool_set, vrng, registry.openai_tools())
        tools = ts.tools
        system = instructions + "\n\n" if instructions else ""
        system = system or system_prompt(random.Random(case.request)).split("# Environment")[0]
        system += f"# Environment\nWorking directory: {d}\nPlatform: Linux\nGit repository: no"
        messages: list[dict[str, Any]] = [
            *vocab.system_messages(system, ts, vrng),
            {"role": "user", "content": case.request},
        ]
        calls: list[tuple[str, str]] = []
        labels: list[set[str]] = []
        answer = ""
        for _step in range(max_steps):
            ids = tok.apply_chat_template(messages, tools, add_generation_prompt=True)
            out = greedy(model.cfg, model.weights, ids, set(tok.eos_token_ids), max_new)
            parsed = parse_full(tok.decode(out, skip_special_tokens=False).split("<|END_OF_TURN_TOKEN|>")[0])
            if not parsed.tool_calls:
                answer = parsed.content
                break
            tool_calls = []
            results = []
            for k, c in enumerate(parsed.tool_calls):
                cid = f"call_{len(calls) + k + 1}"
                tool_calls.append(
                    {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                )
                result = vocab.execute(ts, registry, c.name, c.arguments, root, vrng)
                results.append({"role": "tool", "tool_call_id": cid, "content": result})
            labels += [vocab.action_labels(ts, c.name, c.arguments, root) for c in parsed.tool_calls]
            calls += [(c.name, c.arguments) for c in parsed.tool_calls]
            turn: dict[str, Any] = {"role": "assistant", "content": parsed.content, "tool_calls": tool_calls}
            # mkcode's agent keeps a call's plan in the history (app/agent/loop.py); OpenAI-wire clients drop it
            if tool_set == "mkcode" and parsed.reasoning:
                turn["reasoning_content"] = parsed.reasoning
            messages.append(turn)
            messages += results
        invented = invented_names(answer, case.files)
        edited = None
        if case.edit is not None:
            path, old, new = case.edit
            after = {rel: (root / rel).read_text() for rel in case.files}
            want = dict(case.files)
            want[path] = case.files[path].replace(old, new, 1)
            edited = after == want
    right = bool(labels) and bool(labels[0] & EXPECTED_ACTIONS[case.kind])
    if case.kind == "edit":
        right = right and any("edit" in x for x in labels)
    return Outcome(case, calls, answer, right, invented, edited)


def invented_names(answer: str, files: dict[str, str] | list[str]) -> list[str]:
    """File names in `answer` that name no file of the workspace (a file counts under its path, its
    base name, or a path suffix: `src/app.py`, `app.py`)."""
    present = set()
    for rel in files:
        parts = rel.split("/")
        present |= {"/".join(parts[i:]) for i in range(len(parts))}  # the file, its base name...
        present |= {"/".join(parts[: i + 1]) + "/" for i in range(len(parts) - 1)}  # ...its directories
    return sorted({n for n in FILE_NAME.findall(answer) if n not in present})


@dataclass
class _Model:
    cfg: Any
    weights: Any


def evaluate_checkpoint(
    path: Path,
    seed: int = 9001,
    per_kind: int = 8,
    long_prompt_tokens: int = 0,
    device: str = "cpu",
    tool_set: str = "mkcode",
) -> EvalResult:
    """Load the checkpoint at `path` (as the CPU runtime does, float32) and run the held-out set;
    with `long_prompt_tokens`, behind a system prompt of about that many tokens (`long_system_prompt`,
    the shape of OpenCode's and Codex CLI's) instead of the short one. `device` "cuda" runs the same
    float32 model on a GPU (quicker for long prompts). `tool_set` "opencode" or "codex" offers that
    client's tools (names, arguments, result formats) instead of mkcode's."""
    import torch

    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.checkpoint.loader import load_checkpoint
    from mkcode.backend.demo.shipped import demo_model_version

    t0 = time.monotonic()
    ck = load_checkpoint(path, device=device, dtype=torch.float32, progress=False)
    tok = ChatTokenizer(path)
    model = _Model(ck.config, ck.weights)
    with torch.inference_mode():
        long = (
            long_system_prompt(random.Random(seed), tok, long_prompt_tokens) if long_prompt_tokens else None
        )
        outcomes = [
            run_case(model, tok, c, instructions=long, tool_set=tool_set)
            for c in held_out_cases(seed, per_kind)
        ]
    return EvalResult(outcomes, time.monotonic() - t0, demo_model_version(path), tool_set=tool_set)


def write_report(
    directory: Path,
    result: EvalResult,
    extra: list[str] | None = None,
    command: str | None = None,
    name: str = "REPORT.md",
    others: list[EvalResult] | None = None,
) -> Path:
    """REPORT.md: the rates, then one line per request (what it called, what it answered); `others`
    (the same set under other tool sets) each get a section of their own after it."""
    under = "" if result.tool_set == "mkcode" else f" under {result.tool_set}'s tool set"
    lines = [
        f"# Demo model {result.version}: held-out evaluation{under}",
        "",
        "Scripted requests in phrasings the training dialogues never use, each in a fresh temporary",
        "workspace with mkcode's real tools executing the calls (`backend/demo/evaluate.py`,",
        f"greedy decoding, float32 on the CPU; {len(result.outcomes)} requests in {result.seconds:.0f} s).",
        "",
        *_table(result),
    ]
    if command:
        lines += ["", f"Trained with `{command}`; evaluated with `mkcode demo-model --evaluate` (same set)."]
    if extra:
        lines += ["", *extra]
    for other in others or []:
        lines += [
            "",
            f"## Under {other.tool_set}'s tool set",
            "",
            f"The same requests with {other.tool_set}'s tools offered (its tool names, arguments, result "
            "formats and environment message; `evaluate_checkpoint(path, tool_set=...)`, "
            f"{other.seconds:.0f} s):",
            "",
            *_table(other),
        ]
    lines += ["", "## Requests", "", *_request_lines(result)]
    for other in others or []:
        lines += ["", f"## Requests under {other.tool_set}'s tool set", "", *_request_lines(other)]
    out = directory / name
    out.write_text("\n".join(lines) + "\n")
    return out


def _table(result: EvalResult) -> list[str]:
    lines = ["| measure | count | rate |", "|---|---|---|"]
    for k, (a, b) in result.rates().items():
        lines.append(f"| {k} | {a}/{b} | {100 * a / max(b, 1):.0f}% |")
    return lines


def _request_lines(result: EvalResult) -> list[str]:
    lines = []
    for o in result.outcomes:
        calls = ", ".join(f"{n}({json.loads(a) if _is_json(a) else a})" for n, a in o.calls) or "no call"
        marks = [("tool ok" if o.right_tool else "WRONG TOOL")]
        if o.case.kind in {"list", "read"}:
            marks.append("grounded" if o.grounded else f"NOT GROUNDED {o.invented}")
        if o.edited is not None:
            marks.append("edit ok" if o.edited else "EDIT FAILED")
        lines.append(
            f"- [{o.case.kind}] {o.case.request!r} → {calls} → {o.answer.strip()!r} ({', '.join(marks)})"
        )
    return lines


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


LONG_PROMPT_LINES = [
    "- Read the relevant files before you change them, and keep each change as small as the task allows.",
    "- Prefer the dedicated file tools over shell commands for reading, searching and editing files.",
    "- Never invent file names, paths or command output; quote what the tools returned.",
    "- When a command fails, read its output, fix the cause and run it again before reporting.",
    "- Follow the conventions of the surrounding code: naming, formatting, imports and error handling.",
    "- Ask before destructive operations such as deleting files or rewriting history.",
    "- Summarise what you changed and how you checked it in a few sentences at the end.",
]


def long_system_prompt(rng: random.Random, tok: Any, target_tokens: int) -> str:
    """A system prompt of about `target_tokens` tokens in the shape of the long agent prompts
    (OpenCode's is ~10.4K tokens, Codex CLI's ~9.6K): numbered sections of instruction lines."""
    parts: list[str] = []
    n = 0
    section = 0
    while n < target_tokens:
        section += 1
        block = [f"## Section {section}: {rng.choice(['Editing', 'Testing', 'Style', 'Safety', 'Tools'])}"]
        block += rng.sample(LONG_PROMPT_LINES, 4)
        text = "\n".join(block) + "\n"
        parts.append(text)
        n += len(tok.encode(text))
    return "You are mkcode, a coding assistant working through tools.\n\n" + "".join(parts)


def long_context_check(path: Path, target_tokens: int = 12_000) -> dict[str, Any]:
    """Prefill a request behind a ~`target_tokens` system prompt on the CPU; time it and decode the
    first turn (the call it makes, if any)."""
    import torch

    from mkcode.backend.chat.parser import parse_full
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.checkpoint.loader import load_checkpoint
    from mkcode.backend.demo.trainer import _tool_schemas
    from mkcode.backend.model.reference import ReferenceModel

    ck = load_checkpoint(path, device="cpu", dtype=torch.float32, progress=False)
    tok = ChatTokenizer(path)
    tools = _tool_schemas()
    system = long_system_prompt(random.Random(0), tok, target_tokens - 2_000)  # tools add ~1.9K
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "List the files in the project."},
    ]
    ids = tok.apply_chat_template(messages, tools, add_generation_prompt=True)
    if len(ids) > ck.config.max_position_embeddings:
        raise ValueError(f"{len(ids)} tokens exceed the context of {ck.config.max_position_embeddings}")
    model = ReferenceModel(ck.config, ck.weights)
    with torch.inference_mode():
        cache = model.new_cache(len(ids) + 80)
        t0 = time.monotonic()
        logits = model.prefill(cache, ids)
        prefill_s = time.monotonic() - t0
        out: list[int] = []
        eos = set(tok.eos_token_ids)
        while len(out) < 60:
            t = int(logits.argmax())
            out.append(t)
            if t in eos:
                break
            logits = model.decode(cache, t, len(ids) + len(out) - 1)
    parsed = parse_full(tok.decode(out, skip_special_tokens=False).split("<|END_OF_TURN_TOKEN|>")[0])
    return {
        "prompt_tokens": len(ids),
        "max_position_embeddings": ck.config.max_position_embeddings,
        "prefill_seconds": round(prefill_s, 2),
        "first_call": [(c.name, c.arguments) for c in parsed.tool_calls],
        "finite": bool(torch.isfinite(logits).all()),
    }


def result_json(result: EvalResult) -> dict[str, Any]:
    """The rates and every request's calls, answer and marks, JSON-ready."""
    return {
        "version": result.version,
        "tool_set": result.tool_set,
        "seconds": round(result.seconds, 1),
        "rates": {k: list(v) for k, v in result.rates().items()},
        "requests": [
            {
                "kind": o.case.kind,
                "request": o.case.request,
                "calls": o.calls,
                "answer": o.answer,
                "right_tool": o.right_tool,
                "invented": o.invented,
                "edited": o.edited,
            }
            for o in result.outcomes
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m mkcode.backend.demo.evaluate DIR`: the held-out rates of the checkpoint in DIR, under
    one or more tool sets (mkcode's, OpenCode's, Codex CLI's)."""
    import argparse
    import sys

    from mkcode.backend.demo.vocabularies import SET_NAMES

    p = argparse.ArgumentParser(prog="python -m mkcode.backend.demo.evaluate", description=main.__doc__)
    p.add_argument("model", type=Path, help="checkpoint directory")
    p.add_argument(
        "--tool-set",
        nargs="+",
        default=["mkcode"],
        choices=[n for n in SET_NAMES if n != "renamed"],
        help="tool sets to evaluate under, in order (default mkcode)",
    )
    p.add_argument("--per-kind", type=int, default=8, help="requests per kind (default 8)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way)")
    p.add_argument("--json", type=Path, help="write every set's rates and transcripts here")
    p.add_argument(
        "--report", type=Path, help="write a report in REPORT.md's format here (the first set first)"
    )
    p.add_argument("--trained-with", help="the training command, quoted in the report")
    args = p.parse_args(argv)
    results = []
    for name in args.tool_set:
        result = evaluate_checkpoint(args.model, per_kind=args.per_kind, device=args.device, tool_set=name)
        print(f"{name}: {result.summary()}", file=sys.stderr, flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps([result_json(r) for r in results], indent=1) + "\n")
    if args.report:
        write_report(
            args.report.parent,
            results[0],
            command=args.trained_with,
            name=args.report.name,
            others=results[1:],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
