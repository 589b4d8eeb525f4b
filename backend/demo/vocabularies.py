"""Tool vocabularies for the demo model's training data: the tools a client offers, by name,
argument names and schema, so that the model learns to call whatever tools the request lists
instead of mkcode's own names only.

- `mkcode`: the registry's tools (`ToolRegistry.openai_tools()`), the dialogues exactly as
  `dialogues.py` writes them.
- `opencode`: the tools OpenCode 1.18 sends over Chat Completions (bash, edit, glob, grep, read,
  skill, task, todowrite, webfetch, write: `read` takes a `filePath`, absolute or relative, and reads
  a file or lists a directory). Results mirror the shapes OpenCode's tools return (read's
  `<path>/<type>/<content>` block with `N: line` numbering, grep's "Found N matches" grouped by file,
  absolute paths from glob, "(no output)" for a silent command).
- `codex`: the tools Codex CLI 0.171 sends over the Responses API (exec_command, write_stdin,
  request_user_input, view_image, get_goal, create_goal, update_goal): there is no file tool, so
  every action is a shell command in `exec_command(cmd)` (`ls -AF`, `cat -n`, `grep -rn`, `find`,
  `sed -i`), and its result has Codex's wrapper (chunk id, wall time, exit code, token count, output).
  The environment comes as an `<environment_context>` user message, as Codex sends it.
- `renamed`: a random renaming per batch (run_shell -> shell/bash/exec/..., argument command -> cmd/
  script, file tools renamed, some left out so that the shell does their work, a few unrelated tools
  added), with mkcode's result formats: the model has to read the names from the schema.

Names, argument names and types are interface facts of the clients (checked against what the
installed clients really send by tests/backend/demo/test_client_tool_sets.py); every description here
is written for mkcode. A dialogue is generated in mkcode's terms and then translated (`translate`):
each call and its result are rewritten into the set's tools and formats, and the system message into
the set's environment shape. `execute` runs a call of any set against a real workspace through
mkcode's registry (the held-out evaluation under a client's vocabulary).
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Message = dict[str, Any]
Schema = dict[str, Any]

SET_NAMES = ("mkcode", "opencode", "codex", "renamed")
# The training mixes `DemoTrainConfig.tool_sets` names (weights per set).
MIXES: dict[str, tuple[tuple[str, float], ...]] = {
    "mkcode": (("mkcode", 1.0),),
    "mixed": (("mkcode", 0.3), ("opencode", 0.2), ("codex", 0.25), ("renamed", 0.25)),
}


def _tool(
    name: str, description: str, properties: dict[str, Any], required: list[str], **extra: Any
) -> Schema:
    params: dict[str, Any] = {**extra.pop("head", {}), "type": "object", "properties": properties}
    params["required"] = required
    params.update(extra)
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def _s(description: str, **more: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **more}


# ---- OpenCode 1.18 (Chat Completions through @ai-sdk/openai-compatible): names, arguments, types.

_OC_HEAD = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
_OC_INT = {
    "minimum": -9007199254740991,
    "exclusiveMinimum": 0,
    "type": "integer",
    "maximum": 9007199254740991,
}
_OC_UINT = {"minimum": 0, "type": "integer", "maximum": 9007199254740991}


def opencode_tools() -> list[Schema]:
    h = {"head": _OC_HEAD}
    return [
        _tool("bash", "Run a shell command in the project and return what it printed.",
              {"command": _s("Command line to run."),
               "timeout": {**_OC_INT, "description": "Time limit in milliseconds."},
               "workdir": _s("Directory to run it in (default: the project directory).")},
              ["command"], **h),
        _tool("edit", "Replace an exact piece of text in a file.",
              {"filePath": _s("Path of the file to change."), "oldString": _s("Text to find."),
               "newString": _s("Text to put in its place."),
               "replaceAll": {"type": "boolean", "description": "Replace every occurrence."}},
              ["filePath", "oldString", "newString"], **h),
        _tool("glob", "Find files whose path matches a glob pattern.",
              {"pattern": _s("Glob pattern, e.g. **/*.py."), "path": _s("Directory to search (default: project).")},
              ["pattern"], **h),
        _tool("grep", "Search file contents with a regular expression.",
              {"pattern": _s("Regular expression."), "path": _s("Directory to search."),
               "include": _s("Only files matching this glob.")},
              ["pattern"], **h),
        _tool("read", "Read a file (numbered lines) or list a directory.",
              {"filePath": _s("Path of the file or directory."),
               "offset": {**_OC_UINT, "description": "First line (1-based)."},
               "limit": {**_OC_UINT, "description": "How many lines."}},
              ["filePath"], **h),
        _tool("skill", "Load a named skill's instructions.", {"name": _s("Skill name.")}, ["name"], **h),
        _tool("task", "Hand a task to a helper agent.",
              {"description": _s("A few words on the task."), "prompt": _s("What the helper should do."),
               "subagent_type": _s("Which helper."), "task_id": _s("Resume this earlier task."),
               "command": _s("The command that started it.")},
              ["description", "prompt", "subagent_type"], **h),
        _tool("todowrite", "Replace the todo list.",
              {"todos": {"type": "array", "items": {"type": "object", "properties": {
                  "content": _s("The item."), "status": _s("pending, in_progress, completed or cancelled."),
                  "priority": _s("high, medium or low.")}, "required": ["content", "status", "priority"]},
                  "description": "The whole list."}},
              ["todos"], **h),
        _tool("webfetch", "Fetch a web page.",
              {"url": _s("Address to fetch."),
               "format": {"type": "string", "enum": ["text", "markdown", "html"], "description": "Output format.",
                          "default": "markdown"},
               "timeout": {"type": "number", "description": "Seconds."}},
              ["url"], **h),
        _tool("write", "Write a whole file.",
              {"content": _s("The file's new content."), "filePath": _s("Path of the file.")},
              ["content", "filePath"], **h),
    ]  # fmt: skip


# ---- Codex CLI 0.171 (Responses API): names, arguments, types.


def codex_tools() -> list[Schema]:
    closed = {"additionalProperties": False}
    num = {"type": "number"}
    option = {"type": "object", "properties": {"description": _s("What choosing it means."), "label": _s("Short label.")},
              "required": ["label", "description"], **closed}  # fmt: skip
    question = {"type": "object", "properties": {
        "header": _s("Short header."), "id": _s("Identifier."),
        "options": {"type": "array", "description": "Choices.", "items": option},
        "question": _s("The question.")}, "required": ["id", "header", "question", "options"], **closed}  # fmt: skip
    return [
        _tool("exec_command", "Run a shell command in the working directory; returns its output and exit code.",
              {"cmd": _s("The command line."), "justification": _s("Why it needs more permissions."),
               "login": {"type": "boolean", "description": "Use a login shell."},
               "max_output_tokens": {**num, "description": "Output budget in tokens."},
               "prefix_rule": {"type": "array", "description": "Command prefix to approve.", "items": {"type": "string"}},
               "sandbox_permissions": _s("Sandbox mode.", enum=["use_default", "require_escalated"]),
               "shell": _s("Shell program."), "tty": {"type": "boolean", "description": "Use a terminal."},
               "workdir": _s("Directory to run in."),
               "yield_time_ms": {**num, "description": "How long to wait for output."}},
              ["cmd"], **closed),
        _tool("write_stdin", "Send input to a running command.",
              {"chars": _s("Text to send."), "max_output_tokens": {**num, "description": "Output budget."},
               "session_id": {**num, "description": "The running command."},
               "yield_time_ms": {**num, "description": "How long to wait for output."}},
              ["session_id"], **closed),
        _tool("request_user_input", "Ask the user to choose.",
              {"questions": {"type": "array", "description": "The questions.", "items": question}},
              ["questions"], **closed),
        _tool("view_image", "Show an image file.", {"path": _s("Image path.")}, ["path"], **closed),
        _tool("get_goal", "Show the current goal.", {}, [], **closed),
        _tool("create_goal", "Start a goal.",
              {"objective": _s("What to achieve."), "token_budget": {"type": "integer", "description": "Budget."}},
              ["objective"], **closed),
        _tool("update_goal", "Change the goal's status.",
              {"status": _s("New status.", enum=["complete", "blocked", "paused"])}, ["status"], **closed),
    ]  # fmt: skip


@dataclass
class ToolSet:
    """One vocabulary: the schemas a client sends and how mkcode's actions map onto them."""

    name: str  # mkcode | opencode | codex | renamed
    tools: list[Schema]
    # mkcode tool -> this set's tool; a mkcode tool missing here is done with a shell command
    names: dict[str, str] = field(default_factory=dict)
    # mkcode tool -> {mkcode argument -> this set's argument}
    args: dict[str, dict[str, str]] = field(default_factory=dict)
    style: str = "mkcode"  # result formats: mkcode | opencode | codex

    @property
    def shell(self) -> str:
        return self.names["run_shell"]

    @property
    def shell_arg(self) -> str:
        return self.args["run_shell"]["command"]

    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


_MK_TOOLS = ("read_file", "list_dir", "glob", "grep", "edit_file", "write_file", "run_shell")


def mkcode_set(tools: list[Schema]) -> ToolSet:
    """mkcode's registry (`tools`: its `openai_tools()`)."""
    args = {
        t["function"]["name"]: {k: k for k in t["function"]["parameters"].get("properties", {})}
        for t in tools
    }
    return ToolSet("mkcode", tools, {n: n for n in args}, args, "mkcode")


def opencode_set() -> ToolSet:
    path = {"path": "filePath"}
    return ToolSet(
        "opencode",
        opencode_tools(),
        {"read_file": "read", "list_dir": "read", "glob": "glob", "grep": "grep", "edit_file": "edit",
         "write_file": "write", "run_shell": "bash"},
        {"read_file": path, "list_dir": path, "glob": {"pattern": "pattern"}, "grep": {"pattern": "pattern"},
         "edit_file": {**path, "old_string": "oldString", "new_string": "newString"},
         "write_file": {**path, "content": "content"}, "run_shell": {"command": "command"}},
        "opencode",
    )  # fmt: skip


def codex_set() -> ToolSet:
    return ToolSet(
        "codex", codex_tools(), {"run_shell": "exec_command"}, {"run_shell": {"command": "cmd"}}, "codex"
    )


# ---- Random renamings: names and argument names drawn per batch, mkcode's result formats.

_RENAMES: dict[str, list[str]] = {
    "run_shell": [
        "shell",
        "bash",
        "exec",
        "run_command",
        "terminal",
        "execute",
        "sh",
        "run_shell",
        "command",
    ],
    "read_file": ["read", "cat", "view_file", "open_file", "read_file", "view", "file_read"],
    "list_dir": ["ls", "list", "list_files", "list_directory", "dir", "list_dir"],
    "grep": ["grep", "search", "search_code", "find_in_files", "rg", "grep_search"],
    "glob": ["glob", "find_files", "glob_files", "file_search", "find"],
    "edit_file": ["edit", "edit_file", "replace", "str_replace", "patch_file", "modify_file"],
    "write_file": ["write", "write_file", "create_file", "save_file"],
}
_SHELL_ARGS = ["command", "cmd", "script", "command_line"]
_PATH_ARGS = ["path", "file", "file_path", "filePath", "filename", "target"]
_DIR_ARGS = ["path", "dir", "directory", "dirPath", "folder"]
_PATTERN_ARGS = ["pattern", "query", "regex", "expression"]
_GLOB_ARGS = ["pattern", "glob", "query"]
_OLD_NEW = [("old_string", "new_string"), ("oldString", "newString"), ("old_str", "new_str"), ("old", "new"),
            ("search", "replace"), ("old_text", "new_text")]  # fmt: skip
_CONTENT_ARGS = ["content", "text", "contents"]
# Left out with these odds (the shell does their work); the shell and read are nearly always there.
_DROP = {"list_dir": 0.35, "glob": 0.4, "grep": 0.3, "edit_file": 0.15, "write_file": 0.3, "read_file": 0.1}
_DESCRIBE = {
    "run_shell": "Run a shell command in the project directory; returns its output and exit code.",
    "read_file": "Read a text file; lines come numbered.",
    "list_dir": "List the entries of a directory (directories end with '/').",
    "grep": "Search the project's files for a regular expression; prints path:line:text.",
    "glob": "Find files by glob pattern.",
    "edit_file": "Replace an exact, unique piece of text in a file; returns the diff.",
    "write_file": "Write a file with the given content.",
}
_DISTRACTORS = [
    _tool("web_fetch", "Fetch a URL.", {"url": _s("Address.")}, ["url"]),
    _tool("todo_write", "Update the task list.", {"todos": {"type": "array", "items": {"type": "string"}}}, ["todos"]),
    _tool("ask_user", "Ask the user a question.", {"question": _s("The question.")}, ["question"]),
    _tool("view_image", "Look at an image file.", {"path": _s("Image path.")}, ["path"]),
    _tool("think", "Write down a thought.", {"thought": _s("The thought.")}, ["thought"]),
    _tool("create_goal", "Start a goal.", {"objective": _s("What to achieve.")}, ["objective"]),
]  # fmt: skip


def renamed_set(rng: random.Random) -> ToolSet:
    """A random vocabulary over mkcode's actions (see the module doc)."""
    names: dict[str, str] = {}
    args: dict[str, dict[str, str]] = {}
    schemas: list[Schema] = []
    path_arg = rng.choice(_PATH_ARGS)
    for mk in _MK_TOOLS:
        if mk != "run_shell" and rng.random() < _DROP[mk]:
            continue
        name = rng.choice([n for n in _RENAMES[mk] if n not in names.values()])
        props: dict[str, Any] = {}
        if mk == "run_shell":
            a = {"command": rng.choice(_SHELL_ARGS)}
            props[a["command"]] = _s("The command line.")
            if rng.random() < 0.5:
                props["timeout"] = {"type": "integer", "description": "Seconds."}
        elif mk == "read_file":
            a = {"path": path_arg}
            props[path_arg] = _s("File to read.")
            if rng.random() < 0.5:
                props.update(offset={"type": "integer", "description": "First line."},
                             limit={"type": "integer", "description": "Line count."})  # fmt: skip
        elif mk == "list_dir":
            a = {"path": rng.choice(_DIR_ARGS)}
            props[a["path"]] = _s("Directory ('.' is the project).")
        elif mk == "grep":
            a = {"pattern": rng.choice(_PATTERN_ARGS)}
            props[a["pattern"]] = _s("Regular expression.")
            if rng.random() < 0.5:
                props["path"] = _s("Where to search.")
        elif mk == "glob":
            a = {"pattern": rng.choice(_GLOB_ARGS)}
            props[a["pattern"]] = _s("Glob pattern.")
        elif mk == "edit_file":
            old, new = rng.choice(_OLD_NEW)
            a = {"path": path_arg, "old_string": old, "new_string": new}
            props.update(
                {path_arg: _s("File to edit."), old: _s("Exact text to replace."), new: _s("Replacement.")}
            )
        else:
            a = {"path": path_arg, "content": rng.choice(_CONTENT_ARGS)}
            props.update({path_arg: _s("File to write."), a["content"]: _s("The content.")})
        required = list(a.values())
        names[mk], args[mk] = name, a
        schemas.append(_tool(name, _DESCRIBE[mk], props, required, additionalProperties=False))
    taken = set(names.values())
    schemas += [
        copy.deepcopy(t)
        for t in rng.sample(_DISTRACTORS, rng.randint(0, 2))
        if t["function"]["name"] not in taken
    ]
    rng.shuffle(schemas)
    return ToolSet("renamed", schemas, names, args, "mkcode")


def tool_set(name: str, rng: random.Random, mkcode_tools: list[Schema]) -> ToolSet:
    if name == "mkcode":
        return mkcode_set(mkcode_tools)
    if name == "opencode":
        return opencode_set()
    if name == "codex":
        return codex_set()
    if name == "renamed":
        return renamed_set(rng)
    raise ValueError(f"unknown tool set {name!r} (known: {', '.join(SET_NAMES)})")


def draw_tool_set(
    mix: tuple[tuple[str, float], ...], rng: random.Random, mkcode_tools: list[Schema]
) -> ToolSet:
    names, weights = zip(*mix)
    return tool_set(rng.choices(names, weights=weights)[0], rng, mkcode_tools)


# ---- Result formats.

_RUN = re.compile(r"(?:Error: exit code (\d+)\n)?(.*?)\[exit code: (-?\d+)\][^\n]*", re.S)


def parse_run(result: str) -> tuple[str, int]:
    """(output, exit code) of a run_shell result in mkcode's format."""
    m = _RUN.fullmatch(result)
    if m is None:
        raise ValueError(f"not a run_shell result: {result[:80]!r}")
    return m[2], int(m[3])


def mkcode_run(out: str, code: int) -> str:
    """A run_shell result in mkcode's format (the inverse of `parse_run`)."""
    head = f"Error: exit code {code}\n" if code else ""
    return head + (out.rstrip("\n") + "\n" if out else "") + f"[exit code: {code}]"


def codex_output(out: str, code: int, rng: random.Random) -> str:
    """exec_command's result as Codex wraps it."""
    return (
        f"Chunk ID: {rng.getrandbits(24):06x}\nWall time: {rng.uniform(0.0, 0.4):.4f} seconds\n"
        f"Process exited with code {code}\nOriginal token count: {math.ceil(len(out.encode()) / 4)}\n"
        f"Output:\n{out}"
    )


def _entries(listing: str) -> list[str]:
    return [line.split("  ")[0] for line in listing.split("\n") if line]


def _abs(cwd: str, rel: str) -> str:
    if rel.startswith("/"):
        return rel
    return cwd if rel in (".", "") else f"{cwd.rstrip('/')}/{rel}"


def opencode_result(mk: str, args: dict[str, Any], result: str, cwd: str) -> str:
    """The result of an OpenCode tool for the mkcode call `mk(args)` whose mkcode result is `result`."""
    if mk == "list_dir":
        path = _abs(cwd, args.get("path", "."))
        if result.startswith("Error:"):
            return f"File not found: {path}"
        names = _entries(result)
        return (
            f"<path>{path}</path>\n<type>directory</type>\n<entries>\n"
            + "".join(n + "\n" for n in names)
            + f"\n({len(names)} entries)\n</entries>"
        )
    if mk == "read_file":
        path = _abs(cwd, args["path"])
        if result.startswith("Error:"):
            return f"File not found: {path}"
        lines = [line.split("\t", 1) for line in result.split("\n")]
        body = "\n".join(f"{int(n)}: {text}" for n, text in lines)
        return (
            f"<path>{path}</path>\n<type>file</type>\n<content>\n{body}\n\n"
            f"(End of file - total {len(lines)} lines)\n</content>"
        )
    if mk == "grep":
        if result.startswith("no matches") or not result:
            return "No files found"
        hits = [line.split(":", 2) for line in result.split("\n")]
        parts = [f"Found {len(hits)} matches"]
        last = None
        for path, n, text in hits:
            if path != last:
                if last is not None:
                    parts.append("")
                parts.append(f"{_abs(cwd, path)}:")
                last = path
            parts.append(f"  Line {n}: {text}\n")
        return "\n".join(parts)
    if mk == "glob":
        return "\n".join(_abs(cwd, p) for p in result.split("\n")) if result else "No files found"
    if mk == "edit_file":
        return result if result.startswith("Error:") else "Edit applied successfully."
    if mk == "write_file":
        return result if result.startswith("Error:") else "Wrote file successfully."
    if mk == "run_shell":
        out, _code = parse_run(result)
        return out or "(no output)"
    raise ValueError(f"no OpenCode form for {mk}")


def _q(text: str) -> str:
    return text if re.fullmatch(r"[\w./-]+", text) else "'" + text.replace("'", "'\\''") + "'"


def shell_form(mk: str, args: dict[str, Any], result: str) -> tuple[str, str, int]:
    """The shell command that does the mkcode call `mk(args)`, with its output and exit code (given
    the call's mkcode `result`): ls -AF, cat -n, grep -rn, find, sed -i."""
    if mk == "run_shell":
        out, code = parse_run(result)
        return args["command"], out, code
    if mk == "list_dir":
        path = args.get("path", ".")
        cmd = "ls -AF" if path in (".", "") else f"ls -AF {_q(path)}"
        return cmd, "".join(n + "\n" for n in _entries(result)), 0
    if mk == "read_file":
        path = args["path"]
        if result.startswith("Error:"):
            return f"cat -n {_q(path)}", f"cat: {path}: No such file or directory\n", 1
        return f"cat -n {_q(path)}", result + "\n", 0
    if mk == "grep":
        cmd = f"grep -rn {_q(args['pattern'])} ."
        if result.startswith("no matches") or not result:
            return cmd, "", 1
        return cmd, "".join(f"./{line}\n" for line in result.split("\n")), 0
    if mk == "glob":
        name = args["pattern"].rsplit("/", 1)[-1]
        return f"find . -name {_q(name)} | sort", "".join(f"./{p}\n" for p in result.split("\n") if p), 0
    if mk == "edit_file":
        old, new = args["old_string"], args["new_string"]
        if not re.fullmatch(r"[\w ().]*", old + new):
            raise ValueError(f"no sed form for replacing {old!r}")
        sed_old = re.sub(r"([.*\[\]^$])", r"\\\1", old)
        return f"sed -i {_q(f's/{sed_old}/{new}/')} {_q(args['path'])}", "", 0
    raise ValueError(f"no shell form for {mk}")


# ---- Dialogue translation.

NEUTRAL_INSTRUCTIONS = [
    "You are a coding agent working in the user's project. Use the tools you are given to look at and "
    "change files; quote what they return and never guess file names.",
    "You are a helpful coding assistant. Call the tools listed above to inspect and change the project.",
    "Help the user with their code. Look with the tools before answering; keep answers short.",
    "You are a coding agent in a terminal. Work through the available tools, then answer briefly.",
]


def _split_system(system: str) -> tuple[str, str, str]:
    """(instructions, environment lines, anything after them) of a training system message."""
    head, sep, env = system.partition("# Environment\n")
    if not sep:
        return system, "", ""
    env, sep2, rest = env.partition("\n\n")
    return head.rstrip("\n"), env, (sep2 + rest) if sep2 else ""


def _env_value(env: str, key: str) -> str | None:
    m = re.search(rf"^{key}: (.*)$", env, re.M)
    return m[1] if m else None


def system_messages(system: str, ts: ToolSet, rng: random.Random) -> list[Message]:
    """The messages before the user's request, in the set's shape: instructions that name no tool of
    another set, and the environment as the client writes it (OpenCode: an `<env>` block in the system
    message; Codex: an `<environment_context>` user message)."""
    if ts.name == "mkcode":
        return [{"role": "system", "content": system}]
    instructions, env, rest = _split_system(system)
    foreign = [n for n in _MK_TOOLS if ts.names.get(n) != n]
    if any(n in instructions for n in foreign) and len(instructions) < 2000:
        instructions = rng.choice(NEUTRAL_INSTRUCTIONS)
    if ts.style == "opencode" and env:
        block = "<env>\n" + "".join(f"  {line}\n" for line in env.split("\n")) + "</env>"
        return [{"role": "system", "content": f"{instructions}\n\n{block}{rest}"}]
    if ts.style == "codex" and env:
        cwd = _env_value(env, "Working directory") or "/"
        date = _env_value(env, "Date") or ""
        tz = rng.choice(["Etc/UTC", "Europe/Paris", "America/New_York", "Asia/Tokyo"])
        context = (
            f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n"
            f"  <current_date>{date}</current_date>\n  <timezone>{tz}</timezone>\n</environment_context>"
        )
        return [{"role": "system", "content": instructions + rest}, {"role": "user", "content": context}]
    return [
        {
            "role": "system",
            "content": f"{instructions}\n\n# Environment\n{env}{rest}" if env else instructions,
        }
    ]


def working_directory(system: str) -> str:
    _i, env, _r = _split_system(system)
    return _env_value(env, "Working directory") or "/"


def translate_call(
    ts: ToolSet, mk: str, args: dict[str, Any], result: str, cwd: str, rng: random.Random
) -> tuple[str, dict[str, Any], str]:
    """(tool name, arguments, result) in the set's vocabulary for the mkcode call `mk(args)` -> `result`."""
    if ts.name == "mkcode":
        return mk, args, result
    if mk in ts.names and ts.style != "codex":
        mapping = ts.args[mk]
        new_args = {mapping[k]: v for k, v in args.items()}
        if ts.style == "opencode":
            if "filePath" in new_args and rng.random() < 0.7:
                new_args["filePath"] = _abs(cwd, new_args["filePath"])
            return ts.names[mk], new_args, opencode_result(mk, args, result, cwd)
        return ts.names[mk], new_args, result
    cmd, out, code = shell_form(mk, args, result)
    shell_result = codex_output(out, code, rng) if ts.style == "codex" else mkcode_run(out, code)
    return ts.shell, {ts.shell_arg: cmd}, shell_result


def translate(messages: list[Message], ts: ToolSet, rng: random.Random) -> list[Message]:
    """A dialogue written with mkcode's tools, rewritten into the set's vocabulary (a new list; the
    mkcode set returns `messages` itself, unchanged)."""
    if ts.name == "mkcode":
        return messages
    cwd = working_directory(messages[0]["content"])
    out = system_messages(messages[0]["content"], ts, rng)
    pending: dict[str, str] = {}
    for m in messages[1:]:
        m = copy.deepcopy(m)
        if m["role"] == "assistant" and m.get("tool_calls"):
            for c in m["tool_calls"]:
                fn = c["function"]
                result = next(
                    r["content"] for r in messages if r.get("role") == "tool" and r["tool_call_id"] == c["id"]
                )
                name, args, new_result = translate_call(
                    ts, fn["name"], json.loads(fn["arguments"]), result, cwd, rng
                )
                fn["name"], fn["arguments"] = name, json.dumps(args)
                pending[c["id"]] = new_result
        elif m["role"] == "tool":
            m["content"] = pending.pop(m["tool_call_id"])
        out.append(m)
    return out


# ---- Executing a set's calls in a real workspace (the held-out evaluation).


def _rel(root: Path, path: str) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            return str(p.resolve().relative_to(root.resolve())) or "."
        except ValueError:
            return path
    return path or "."


def to_mkcode(ts: ToolSet, name: str, args: dict[str, Any], root: Path) -> tuple[str, dict[str, Any]] | None:
    """The mkcode call that a call of this set stands for (None: a tool with no mkcode counterpart)."""
    if ts.name == "mkcode":
        return name, args
    if name == ts.shell:
        return "run_shell", {"command": str(args.get(ts.shell_arg, ""))}
    for mk, theirs in ts.names.items():
        if theirs != name or mk == "run_shell":
            continue
        back = {v: k for k, v in ts.args[mk].items()}
        mk_args = {back[k]: v for k, v in args.items() if k in back}
        if "path" in mk_args:
            mk_args["path"] = _rel(root, str(mk_args["path"]))
        if theirs == "read" and ts.style == "opencode":  # one tool for files and directories
            mk = "list_dir" if (root / str(mk_args.get("path", "."))).is_dir() else "read_file"
        return mk, mk_args
    return None


_LIST_CMDS = ("ls", "tree", "find", "dir")
_READ_CMDS = ("cat", "head", "tail", "nl", "less", "more", "bat")
_GREP_CMDS = ("grep", "rg", "ag", "ack")


def shell_labels(cmd: str) -> set[str]:
    """What a shell command does, in action labels (for the tool-choice measure)."""
    words = cmd.strip().split()
    first = words[0] if words else ""
    labels = {"run"}
    if first in _LIST_CMDS:
        labels.add("list")
    if first in _READ_CMDS or (first == "sed" and "-n" in words):
        labels.add("read")
    if first in _GREP_CMDS or cmd.strip().startswith("git grep"):
        labels.add("grep")
    if re.search(r"\bsed\s+-i|\bperl\s+-pi|\bapply_patch\b", cmd):
        labels.add("edit")
    return labels


_MK_LABELS = {"list_dir": "list", "read_file": "read", "grep": "grep", "glob": "glob", "edit_file": "edit",
              "write_file": "write", "run_shell": "run"}  # fmt: skip


def action_labels(ts: ToolSet, name: str, arguments: str, root: Path) -> set[str]:
    """The actions a call performs: list, read, grep, glob, edit, write, run (a shell command of a
    client's set also counts as what the command does: `ls` lists, `cat` reads, `sed -i` edits)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    mk = to_mkcode(ts, name, args, root)
    if mk is None:
        return set()
    labels = {_MK_LABELS.get(mk[0], mk[0])}
    if ts.name != "mkcode" and mk[0] == "run_shell":
        labels |= shell_labels(mk[1]["command"])
    return labels


def execute(ts: ToolSet, registry: Any, name: str, arguments: str, root: Path, rng: random.Random) -> str:
    """Run a call of this set with mkcode's registry in the workspace `root`; the result text in the
    set's format."""
    if ts.name == "mkcode":
        return registry.execute(name, arguments).for_model()
    try:
        args = json.loads(arguments)
    except ValueError:
        return "Error: the arguments are not valid JSON"
    if not isinstance(args, dict):
        return "Error: the arguments must be a JSON object"
    mk = to_mkcode(ts, name, args, root)
    if mk is None:
        return f"Error: {name} is not available here"
    mk_name, mk_args = mk
    result = registry.execute(mk_name, json.dumps(mk_args))
    text = result.for_model()
    if mk_name == "run_shell" and "exit_code" in result.meta:
        out = result.output.rsplit("\n", 1)[0] + "\n" if "\n" in result.output else ""
        code = result.meta["exit_code"] if result.meta["exit_code"] is not None else -1
        if ts.style == "codex":
            return codex_output(out, code, rng)
        if ts.style == "opencode":
            return out or "(no output)"
        return text
    if ts.style == "opencode":
        return opencode_result(mk_name, mk_args, text, str(root))
    return text
