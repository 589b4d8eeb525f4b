"""Generated cmd4 training dialogues: a user asks about a small project; the assistant lists files,
reads them, greps, globs, edits or runs a command (one to three tool calls), then answers.

Dialogues are OpenAI-shaped messages (system, user, assistant with `tool_calls`, tool results, final
assistant text) rendered by the checkpoint's chat template, so the model learns exactly the format
the engine will parse. Tool outputs imitate mkcode's tools (line-numbered reads, `path:line:text`
grep hits, `name  (N bytes)` listings, unified diffs, `[exit code: N]`). Everything is drawn from
a seeded `random.Random`: the same seed gives the same dialogues. A third of the dialogues hold two
tasks in a row (a finished exchange, then a new request), as a session does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

DIRS = ["src", "lib", "app", "pkg", "core", "tests", "scripts", "docs"]
STEMS = [
    "main", "utils", "config", "server", "client", "parser", "models", "views", "cli", "io",
    "math", "calc", "store", "cache", "auth", "api", "db", "jobs", "report", "shapes",
]  # fmt: skip
FUNCS = [
    "add", "parse", "load", "save", "run", "start", "stop", "render", "fetch", "update", "build",
    "check", "merge", "split", "count", "total", "area", "scale", "reset", "greet", "send", "read",
]  # fmt: skip
NOUNS = ["items", "value", "name", "path", "data", "size", "user", "text", "line", "rows", "key", "port"]
OTHER_FILES = ["README.md", "pyproject.toml", "Makefile", "notes.txt", "setup.cfg", ".gitignore", "LICENSE",
               "requirements.txt", "todo.md", "data.json", "CHANGES.md", "config.toml"]  # fmt: skip
# Syllables for made-up names: half of the files and functions get one, so that the model learns to
# copy names from the tool output instead of recalling the ones it saw in training.
SYLLABLES = ["ka", "lo", "mi", "ren", "tor", "vu", "zel", "pa", "qui", "dor", "fen", "gal", "ish", "ux", "bri",
             "sto", "wen", "yar", "hol", "nex", "cy", "jo", "mar", "tes", "ol", "pin", "rak", "sa", "te", "vo"]  # fmt: skip
EXTENSIONS = [".txt", ".md", ".json", ".toml", ".cfg", ".csv", ".sh", ".yaml"]
INSTRUCTIONS = [
    "You are mkcode, a coding assistant working in the user's project through tools.\n"
    "- Look before you change: list, glob, grep and read the relevant files first.\n"
    "- Edit with edit_file (exact, unique text replacement) or write_file; keep changes minimal.\n"
    "- Call tools whenever you need information.\n"
    "- When the task is done, answer briefly.",
    "You are a helpful coding assistant. Use the tools to inspect and change the project.",
    "You are mkcode. Work step by step: inspect files with tools, make small edits, then report.",
    "Help the user with their code. Prefer reading files before answering questions about them.",
]
PLATFORMS = ["Linux 6.8.0", "Linux 5.15.0-105-generic", "Linux 6.1.0-18-amd64", "Darwin 23.4.0"]


@dataclass
class Project:
    files: dict[str, str]  # path -> content

    def listing(self, directory: str = ".") -> str:
        entries: dict[str, str] = {}
        for path, text in self.files.items():
            rel = (
                path
                if directory == "."
                else path[len(directory) + 1 :]
                if path.startswith(directory + "/")
                else None
            )
            if rel is None:
                continue
            head = rel.split("/", 1)
            entries[head[0]] = head[0] + "/" if len(head) > 1 else f"{rel}  ({len(text.encode())} bytes)"
        return "\n".join(entries[k] for k in sorted(entries))

    def py_files(self) -> list[str]:
        return sorted(p for p in self.files if p.endswith(".py"))


def made_up(rng: random.Random) -> str:
    """A name no dialogue is likely to repeat: two or three syllables, sometimes with an underscore."""
    parts = [rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))]
    if rng.random() < 0.25:
        parts.insert(rng.randint(1, len(parts) - 1), "_")
    return "".join(parts)


def stem(rng: random.Random) -> str:
    return made_up(rng) if rng.random() < 0.5 else rng.choice(STEMS)


def func_name(rng: random.Random) -> str:
    return made_up(rng) if rng.random() < 0.4 else rng.choice(FUNCS)


def _function(rng: random.Random, name: str) -> str:
    a, b = rng.sample(NOUNS, 2)
    body = rng.choice(
        [f"return {a} + {b}", f"return [{a} for {a} in {b}]", f"return {a} * {rng.randint(2, 9)}",
         f"print({a}, {b})\n    return None", f"if not {a}:\n        return {b}\n    return {a}"]
    )  # fmt: skip
    return f"def {name}({a}, {b}):\n    {body}\n"


def make_project(rng: random.Random) -> Project:
    files: dict[str, str] = {}
    dirs = rng.sample(DIRS, rng.randint(0, 2))
    for _ in range(rng.randint(1, 5)):
        where = rng.choice([*dirs, "."]) if dirs else "."
        path = f"{stem(rng)}.py" if where == "." else f"{where}/{stem(rng)}.py"
        names = list(dict.fromkeys(func_name(rng) for _ in range(rng.randint(1, 3))))
        files[path] = "\n\n".join(_function(rng, n) for n in names)
    others = rng.sample(OTHER_FILES, rng.randint(0, 2))
    others += [made_up(rng) + rng.choice(EXTENSIONS) for _ in range(rng.randint(0, 2))]
    for other in others:
        files[other] = f"# {stem(rng)} project\n" if other.endswith(".md") else "[tool]\nname = 'demo'\n"
    return Project(files)


def numbered(text: str) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(text.rstrip("\n").split("\n"), 1))


def defined(project: Project) -> list[tuple[str, int, str]]:
    """(path, line, function name) of every def in the project."""
    out = []
    for path in project.py_files():
        for i, line in enumerate(project.files[path].split("\n"), 1):
            if line.startswith("def "):
                out.append((path, i, line[4 : line.index("(")]))
    return out


class _Builder:
    """Accumulates one dialogue: assistant tool calls get ids call_1, call_2, ..."""

    def __init__(self, rng: random.Random, system: str, user: str) -> None:
        self.rng = rng
        self.messages: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        self.n = 0

    def call(self, thought: str, name: str, args: dict[str, Any], result: str) -> None:
        self.n += 1
        cid = f"call_{self.n}"
        self.messages.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": thought,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                ],
            }
        )
        self.messages.append({"role": "tool", "tool_call_id": cid, "content": result})

    def answer(self, text: str) -> list[Message]:
        self.messages.append({"role": "assistant", "content": text})
        return self.messages


def _names(listing: str) -> str:
    return ", ".join(line.split("  ")[0] for line in listing.split("\n"))


LIST_ASKS = ["List the files in the project.", "What files are here?", "Show me the project files.",
             "list the files", "What is in this directory?", "Which files does this project have?",
             "ls", "What files are in this project?", "Show the files.", "list files please",
             "What's in the current folder?", "Can you list the files?", "show me what files exist"]  # fmt: skip


def task_list(rng: random.Random, p: Project, system: str) -> list[Message]:
    dirs = sorted({f.split("/")[0] for f in p.files if "/" in f})
    if dirs and rng.random() < 0.25:
        d = rng.choice(dirs)
        user = rng.choice([f"List the files in {d}.", f"What is in {d}/?", f"Show me the files in {d}."])
        b = _Builder(rng, system, user)
        listing = p.listing(d)
        b.call(f"I will list {d}.", "list_dir", {"path": d}, listing)
        return b.answer(f"{d} contains: {_names(listing)}.")
    b = _Builder(rng, system, rng.choice(LIST_ASKS))
    listing = p.listing()
    b.call("I will list the project directory.", "list_dir", {"path": "."}, listing)
    return b.answer(f"The project contains: {_names(listing)}.")


def task_read(rng: random.Random, p: Project, system: str) -> list[Message]:
    path = rng.choice(p.py_files())
    user = rng.choice([f"Show me {path}.", f"What is in {path}?", f"Read {path}.", f"What does {path} do?",
                       f"Open {path}.", f"cat {path}", f"Print the contents of {path}.",
                       f"read {path} please", f"Can you read {path}?"])  # fmt: skip
    b = _Builder(rng, system, user)
    b.call(f"I will read {path}.", "read_file", {"path": path}, numbered(p.files[path]))
    funcs = [n for f, _, n in defined(p) if f == path]
    return b.answer(f"{path} defines {', '.join(funcs)}.")


def task_explore(rng: random.Random, p: Project, system: str) -> list[Message]:
    user = rng.choice(
        ["What does this project do?", "Give me an overview of the code.", "Explain this project."]
    )
    b = _Builder(rng, system, user)
    listing = p.listing()
    b.call("I will look at the files first.", "list_dir", {"path": "."}, listing)
    path = next((f for f in p.py_files() if "/" not in f), None)
    if path is None:
        path = p.py_files()[0]
    b.call(f"I will read {path}.", "read_file", {"path": path}, numbered(p.files[path]))
    funcs = [n for f, _, n in defined(p) if f == path]
    return b.answer(f"It is a small Python project; {path} defines {', '.join(funcs)}.")


def task_find(rng: random.Random, p: Project, system: str) -> list[Message]:
    path, line, name = rng.choice(defined(p))
    user = rng.choice([f"Where is {name} defined?", f"Find the function {name}.", f"Which file has {name}?",
                       f"Search for {name}.", f"grep for {name}", f"Find {name} in the code.",
                       f"Where is the {name} function?"])  # fmt: skip
    b = _Builder(rng, system, user)
    hits = "\n".join(
        f"{f}:{i}:def {n}(" + p.files[f].split("\n")[i - 1][5 + len(n) :]
        for f, i, n in defined(p)
        if n == name
    )
    b.call(f"I will search for the definition of {name}.", "grep", {"pattern": f"def {name}"}, hits)
    return b.answer(f"{name} is defined in {path} at line {line}.")


def task_glob(rng: random.Random, p: Project, system: str) -> list[Message]:
    user = rng.choice(["Find all Python files.", "Which Python files are there?", "List the .py files."])
    b = _Builder(rng, system, user)
    files = "\n".join(p.py_files())
    b.call("I will glob for Python files.", "glob", {"pattern": "**/*.py"}, files)
    return b.answer(f"There are {len(p.py_files())} Python files: {', '.join(p.py_files())}.")


EDIT_ASKS = ["In {path}, rename {name} to {new}.", "Rename the function {name} in {path} to {new}.",
             "Rename {name} to {new} in {path}.", "Change the name of {name} to {new} in {path}.",
             "In {path} change {name} to {new}.", "Please rename {name} in {path} to {new}.",
             "Edit {path}: rename {name} to {new}.", "Replace {name} with {new} in {path}.",
             "rename {name} to {new} in {path}", "Can you rename {name} to {new} in {path}?"]  # fmt: skip


def task_edit(rng: random.Random, p: Project, system: str) -> list[Message]:
    path, line, name = rng.choice(defined(p))
    new = func_name(rng)
    while new == name:
        new = func_name(rng) + "_new"
    user = rng.choice(EDIT_ASKS).format(path=path, name=name, new=new)
    b = _Builder(rng, system, user)
    b.call(f"I will read {path} first.", "read_file", {"path": path}, numbered(p.files[path]))
    old_line = p.files[path].split("\n")[line - 1]
    new_line = old_line.replace(f"def {name}(", f"def {new}(")
    diff = f"--- a/{path}\n+++ b/{path}\n@@ -{line},1 +{line},1 @@\n-{old_line}\n+{new_line}\n"
    b.call(
        f"I will rename {name} to {new}.",
        "edit_file",
        {"path": path, "old_string": f"def {name}(", "new_string": f"def {new}("},
        diff,
    )
    return b.answer(f"Renamed {name} to {new} in {path}.")


def task_run(rng: random.Random, p: Project, system: str) -> list[Message]:
    cmd, user = rng.choice(
        [("python -m pytest -q", "Run the tests."), ("python -m pytest -q", "Do the tests pass?"),
         ("python -m pytest -q", "run the test suite"), ("python -m pytest -q", "Run pytest."),
         ("git status --short", "What is the git status?"), ("git status --short", "Run git status."),
         ("ls", "Run ls."), ("ls", "Run the ls command.")]
    )  # fmt: skip
    b = _Builder(rng, system, user)
    if cmd.startswith("python"):
        n = rng.randint(1, 20)
        out, ans = (
            f"{'.' * n}\n{n} passed in 0.{rng.randint(10, 99)}s\n[exit code: 0]",
            f"All {n} tests pass.",
        )
    elif cmd.startswith("git"):
        changed = rng.choice(p.py_files())
        out, ans = f" M {changed}\n[exit code: 0]", f"One file is modified: {changed}."
    else:
        names = sorted({f.split("/")[0] for f in p.files})
        out, ans = "\n".join(names) + "\n[exit code: 0]", f"The directory holds {', '.join(names)}."
    b.call(f"I will run {cmd}.", "run_shell", {"command": cmd}, out)
    return b.answer(ans)


TASKS: list[tuple[Callable[[random.Random, Project, str], list[Message]], float]] = [
    (task_list, 3.0),
    (task_read, 2.5),
    (task_explore, 1.0),
    (task_find, 1.5),
    (task_glob, 0.8),
    (task_edit, 2.0),
    (task_run, 1.2),
]


def system_prompt(rng: random.Random) -> str:
    """A system message in the shape mkcode's agent writes: instructions, then the environment."""
    cwd = (
        "/"
        + "/".join(rng.choice(["home", "work", "srv", "tmp", "Users"]) for _ in range(1))
        + "/"
        + rng.choice(["proj", "demo", "app", "repo", "code", "tmpw3k2", "pytest-0/test_e2e0"])
    )
    env = [f"Working directory: {cwd}", f"Platform: {rng.choice(PLATFORMS)}",
           f"Date: 20{rng.randint(24, 27)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"]  # fmt: skip
    env.append(
        rng.choice(["Git repository: no", "Git status:\n## main\n M src/app.py", "Git status:\n## main"])
    )
    return rng.choice(INSTRUCTIONS) + "\n\n# Environment\n" + "\n".join(env)


def _renumber(messages: list[Message], offset: int) -> list[Message]:
    """Shift the call ids of a later task so that ids stay unique in the whole conversation."""
    for m in messages:
        for c in m.get("tool_calls") or []:
            c["id"] = f"call_{int(c['id'].split('_')[1]) + offset}"
        if m.get("role") == "tool":
            m["tool_call_id"] = f"call_{int(m['tool_call_id'].split('_')[1]) + offset}"
    return messages


def _task(rng: random.Random, project: Project, system: str) -> list[Message]:
    tasks, weights = zip(*TASKS)
    return rng.choices(tasks, weights=weights)[0](rng, project, system)


def make_dialogue(rng: random.Random) -> list[Message]:
    """One task; a third of the time preceded by an earlier, finished task in the same session, so
    that the model also acts on a second request."""
    project = make_project(rng)
    system = system_prompt(rng)
    messages = _task(rng, project, system)
    if rng.random() < 1 / 3:
        calls = sum(len(m.get("tool_calls") or []) for m in messages)
        messages += _renumber(_task(rng, project, system)[1:], calls)
    return messages


def fresh_prompt(rng: random.Random) -> list[Message]:
    """The system and user messages of a new dialogue (for checking what the model learned)."""
    return make_dialogue(rng)[:2]
