"""Tool vocabularies in the demo model's training data (backend/demo/vocabularies.py): the default data
is unchanged byte for byte; every set's dialogues render, tokenize and parse through the real chat
template with calls valid against that set's schemas; the shell forms and OpenCode/Codex result
formats are what real commands and the evaluation's executor return; the flags reach the config.
(What the installed clients really send is checked in test_client_tool_sets.py.)"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from mkcode.backend.chat.parser import parse_full
from mkcode.backend.chat.template import chat_template
from mkcode.backend.chat.tokenizer import ChatTokenizer
from mkcode.backend.demo import trainer
from mkcode.backend.demo import vocabularies as vocab
from mkcode.backend.demo.dialogues import (
    make_dialogue,
    task_edit,
    task_explore,
    task_find,
    task_glob,
    task_list,
    task_read,
    task_read_missing,
    training_project,
    training_system_prompt,
)

# Computed from the trainer before tool vocabularies existed (commit fb8c821): the default config's
# data must stay these bytes, so that the shipped checkpoint's command still reproduces it.
PINNED_SMALL = "1804adda151f370715ac8d1fc45cabb1b6c84785a6c6f6444f2d7d89f91c9587"
PINNED_DEFAULT_2_STEPS = "c06ea41e31668a462ebf7421430814190aa6cf89c9f6fdc94c1bf561efac2be0"
PINNED_LONG_STEP_7 = "688878dd7e60d96c7daad066d0926554dda1e56e4fb900ae2fc9e36487a24766"


@pytest.fixture(scope="module")
def data():
    tools, tj = trainer._tool_schemas(), trainer.demo_tokenizer().to_str()
    trainer._init_data(tj, tools)
    return tools, tj


def test_the_default_config_yields_the_same_batches_as_before(data) -> None:
    tools, tj = data
    small = replace(
        trainer.DemoTrainConfig(), steps=8, batch_size=6, long_every=4, long_batch=2, long_chars=(2000, 3000)
    )
    h = hashlib.sha256()
    for _prefix, rows in trainer.batches(small, tj, tools):
        h.update(json.dumps(rows).encode())
    assert h.hexdigest() == PINNED_SMALL
    h = hashlib.sha256(json.dumps(trainer._W["prefix"]).encode())
    for prefix, rows in trainer.batches(replace(trainer.DemoTrainConfig(), steps=2), tj, tools):
        assert prefix == trainer._W["prefix"]
        h.update(json.dumps(rows).encode())
    assert h.hexdigest() == PINNED_DEFAULT_2_STEPS
    _prefix, rows = trainer.make_batch((trainer.DemoTrainConfig(), 7))
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == PINNED_LONG_STEP_7


def test_the_tool_sets_are_part_of_the_recorded_config() -> None:
    default = trainer.DemoTrainConfig()
    assert default.tool_sets == vocab.MIXES["mkcode"] and default.key()["tool_sets"] == (("mkcode", 1.0),)
    mixed = replace(default, tool_sets=vocab.MIXES["mixed"])
    assert mixed.key() != default.key() and mixed.key()["tool_sets"] == vocab.MIXES["mixed"]
    assert {n for n, _ in vocab.MIXES["mixed"]} == set(vocab.SET_NAMES)
    assert trainer._command(mixed).endswith("--tool-sets mixed")
    assert "--tool-sets" not in trainer._command(default)


def _sets(mk_tools) -> list[vocab.ToolSet]:
    rng = random.Random(0)
    return [vocab.tool_set(n, rng, mk_tools) for n in ("mkcode", "opencode", "codex")] + [
        vocab.renamed_set(rng) for _ in range(6)
    ]


def test_every_tool_sets_dialogues_render_parse_and_call_valid_tools(data) -> None:
    tools, _ = data
    tok = ChatTokenizer.from_tokenizer(trainer.demo_tokenizer(), chat_template())
    rng = random.Random(17)
    for ts in _sets(tools):
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in ts.tools}
        assert len(schemas) == len(ts.tools)  # unique names
        for t in ts.tools:
            jsonschema.Draft202012Validator.check_schema(t["function"]["parameters"])
        called: set[str] = set()
        for i in range(30):
            messages = vocab.translate(make_dialogue(rng, 2500 if i % 10 == 0 else 0), ts, rng)
            suffix, targets = trainer.encode_dialogue(messages, ts.tools)
            prefix = trainer._prefix(ts.tools)[1]
            assert tok.apply_chat_template(messages, ts.tools, add_generation_prompt=False) == prefix + suffix
            assert tok.decode([suffix[k] for k in targets]).count("<|END_OF_TURN_TOKEN|>") == sum(
                m["role"] == "assistant" for m in messages
            )
            for k, m in enumerate(messages):
                if m["role"] != "assistant":
                    continue
                before = tok.render(messages[:k], ts.tools, add_generation_prompt=True)
                turn = tok.render(messages[: k + 1], ts.tools, add_generation_prompt=False)[len(before) :]
                parsed = parse_full(turn.removesuffix("<|END_OF_TURN_TOKEN|>"))
                assert not parsed.errors, turn
                if not m.get("tool_calls"):
                    assert parsed.content == m["content"] and not parsed.tool_calls
                    continue
                (call,) = parsed.tool_calls
                assert call.name in schemas, (ts.name, call.name)
                args = json.loads(call.arguments)
                jsonschema.validate(args, schemas[call.name])  # the set's own schema
                called.add(call.name)
        if ts.name == "codex":
            assert called == {"exec_command"}
        elif ts.name == "opencode":
            assert called >= {"read", "grep", "edit", "bash"}
        else:
            assert ts.shell in called or ts.name == "mkcode"


def test_mixed_batches_draw_each_set_with_its_own_prefix(data) -> None:
    config = replace(trainer.DemoTrainConfig(), tool_sets=vocab.MIXES["mixed"], batch_size=2, long_batch=1)
    tok = trainer._W["tok"]
    seen: dict[str, int] = {}
    for step in range(24):
        prefix, rows = trainer.make_batch((config, step))
        text = tok.decode(prefix)
        if prefix == trainer._W["prefix"]:
            kind = "mkcode"
        elif '"name": "exec_command"' in text:
            kind = "codex"
        elif '"name": "todowrite"' in text:
            kind = "opencode"
        else:
            kind = "renamed"
            assert '"name": "read_file"' not in text or '"name": "run_shell"' not in text
        seen[kind] = seen.get(kind, 0) + 1
        assert len(rows) == (1 if step % 8 == 7 else 2)
    assert set(seen) == set(vocab.SET_NAMES), seen


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_shell_forms_print_what_the_real_commands_print(tmp_path: Path) -> None:
    """Codex's shell-only vocabulary: ls -AF, cat -n, grep -rn, find | sort and sed -i, run by bash on
    the project, print exactly the output (and exit with the code) the training data shows."""
    rng = random.Random(8)
    forms = set()
    for k in range(24):
        p = training_project(rng)
        root = tmp_path / str(k)
        _write(root, p.files)
        task = (task_list, task_read, task_find, task_glob, task_edit, task_read_missing)[k % 6]
        messages = task(rng, p, training_system_prompt(rng))
        for m, result in itertools.pairwise(messages):
            if m["role"] != "assistant" or not m.get("tool_calls"):
                continue
            fn = m["tool_calls"][0]["function"]
            cmd, out, code = vocab.shell_form(fn["name"], json.loads(fn["arguments"]), result["content"])
            real = subprocess.run(
                ["bash", "-c", cmd],
                cwd=root,
                capture_output=True,
                text=True,
                env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
            )
            assert (real.stdout + real.stderr, real.returncode) == (out, code), cmd
            forms.add(cmd.split()[0])
    assert forms == {"ls", "cat", "grep", "find", "sed"}


def test_run_results_round_trip_through_mkcodes_format() -> None:
    for out, code in [("", 0), ("x.py\n", 0), ("hi\n", 3), ("", 1), ("\nno tests ran in 0.5s\n", 5)]:
        assert vocab.parse_run(vocab.mkcode_run(out, code)) == (out, code)
    wrapped = vocab.codex_output("README.md\napp.py\nsrc\n", 0, random.Random(0))
    assert re.fullmatch(
        r"Chunk ID: [0-9a-f]{6}\nWall time: \d\.\d{4} seconds\nProcess exited with code 0\n"
        r"Original token count: 6\nOutput:\nREADME.md\napp.py\nsrc\n",
        wrapped,
    )


@pytest.mark.parametrize("name", ["opencode", "codex", "renamed"])
def test_the_evaluation_executor_returns_what_the_training_data_shows(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A translated call run against the project on disk through `vocabularies.execute` (mkcode's
    registry underneath: the held-out evaluation's path) returns the dialogue's result."""
    monkeypatch.setenv("LC_ALL", "C")  # ls and sort order bytewise, as the training data does
    from mkcode.tools import ToolRegistry, Workspace

    rng = random.Random(31)
    mk_tools = trainer._tool_schemas()
    checked = 0
    wrapper = re.compile(r"Chunk ID: [0-9a-f]{6}\nWall time: [\d.]+ seconds\n")
    tasks = (task_list, task_read, task_find, task_glob, task_edit, task_read_missing, task_explore)
    for k in range(14):
        p = training_project(rng)
        root = tmp_path / str(k)
        _write(root, p.files)
        system = re.sub(
            r"Working directory: [^\n]*", f"Working directory: {root}", training_system_prompt(rng)
        )
        ts = vocab.tool_set(name, rng, mk_tools)
        messages = vocab.translate(tasks[k % len(tasks)](rng, p, system), ts, rng)
        registry = ToolRegistry(Workspace(str(root)), mode="full-auto")
        for m, result in itertools.pairwise(messages):
            if m["role"] != "assistant" or not m.get("tool_calls"):
                continue
            fn = m["tool_calls"][0]["function"]
            got = vocab.execute(ts, registry, fn["name"], fn["arguments"], root, rng)
            want = result["content"]
            if ts.style == "codex":
                got, want = wrapper.sub("", got), wrapper.sub("", want)
            got = got.replace(" [ran outside the sandbox]", "")
            assert got == want, (fn, got, want)
            checked += 1
    assert checked >= 14


def test_action_labels_tell_what_a_call_does(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    mk = vocab.mkcode_set(trainer._tool_schemas())
    oc, cx = vocab.opencode_set(), vocab.codex_set()

    def labels(ts, name, args):
        return vocab.action_labels(ts, name, json.dumps(args), tmp_path)

    assert labels(mk, "list_dir", {"path": "."}) == {"list"}
    assert labels(mk, "run_shell", {"command": "ls"}) == {"run"}  # mkcode's own measure, as before
    assert labels(mk, "list_files", {}) == {"list_files"}
    assert labels(oc, "read", {"filePath": str(tmp_path)}) == {"list"}
    assert labels(oc, "read", {"filePath": str(tmp_path / "a.py")}) == {"read"}
    assert labels(oc, "read", {"filePath": "src"}) == {"list"}
    assert labels(oc, "edit", {"filePath": "a.py", "oldString": "x", "newString": "y"}) == {"edit"}
    assert labels(oc, "bash", {"command": "git status"}) == {"run"}
    assert labels(cx, "exec_command", {"cmd": "ls -AF"}) == {"run", "list"}
    assert labels(cx, "exec_command", {"cmd": "cat -n a.py"}) == {"run", "read"}
    assert labels(cx, "exec_command", {"cmd": "sed -n '1,20p' a.py"}) == {"run", "read"}
    assert labels(cx, "exec_command", {"cmd": "grep -rn 'def x' ."}) == {"run", "grep"}
    assert labels(cx, "exec_command", {"cmd": "sed -i 's/a/b/' a.py"}) == {"run", "edit"}
    assert labels(cx, "get_goal", {}) == set()
    assert labels(cx, "list_dir", {"path": "."}) == set()  # mkcode's name is not a Codex tool


def test_system_messages_take_each_clients_environment_shape() -> None:
    rng = random.Random(4)
    system = "You are mkcode. Use edit_file.\n\n# Environment\nWorking directory: /w/p\nDate: 2026-03-04"
    assert vocab.system_messages(system, vocab.mkcode_set(trainer._tool_schemas()), rng) == [
        {"role": "system", "content": system}
    ]
    (oc,) = vocab.system_messages(system, vocab.opencode_set(), rng)
    assert "edit_file" not in oc["content"]
    assert oc["content"].endswith("<env>\n  Working directory: /w/p\n  Date: 2026-03-04\n</env>")
    sys_msg, env = vocab.system_messages(system, vocab.codex_set(), rng)
    assert sys_msg["role"] == "system" and "# Environment" not in sys_msg["content"]
    assert env["role"] == "user" and "<cwd>/w/p</cwd>" in env["content"]
    assert "<current_date>2026-03-04</current_date>" in env["content"]


def test_the_evaluation_runs_a_codex_shaped_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_case under Codex's tools, the model's turns scripted: the prompt carries Codex's tools and
    environment message, the exec_command call runs in the workspace, its Codex-wrapped output goes
    back, and the measure counts `ls -AF` as listing."""
    from mkcode.backend.demo import evaluate
    from mkcode.backend.demo.shipped import SHIPPED_DIR

    tok = ChatTokenizer(SHIPPED_DIR)
    call = json.dumps({"tool_call_id": "0", "tool_name": "exec_command", "parameters": {"cmd": "ls -AF"}})
    turns = [
        f"<|START_THINKING|>List.<|END_THINKING|><|START_ACTION|>[\n    {call}\n]<|END_ACTION|><|END_OF_TURN_TOKEN|>",
        "<|START_THINKING|><|END_THINKING|><|START_TEXT|>The project contains: a.py, src/.<|END_TEXT|><|END_OF_TURN_TOKEN|>",
    ]
    prompts: list[str] = []

    def scripted(cfg, weights, prompt, eos, max_new=120):
        prompts.append(tok.decode(prompt, skip_special_tokens=False))
        return tok.encode(turns[len(prompts) - 1])

    monkeypatch.setattr(evaluate, "greedy", scripted)
    case = evaluate.Case(
        "list", "What files do we have?", {"a.py": "def a():\n    return 1\n", "src/b.py": "x = 1\n"}
    )
    out = evaluate.run_case(evaluate._Model(None, None), tok, case, tool_set="codex")
    assert out.calls == [("exec_command", '{"cmd": "ls -AF"}')] and out.right_tool and out.grounded
    assert '"name": "exec_command"' in prompts[0] and "<environment_context>" in prompts[0]
    assert '"name": "list_dir"' not in prompts[0]
    assert re.search(
        r"Process exited with code 0\\nOriginal token count: \d+\\nOutput:\\na\.py\\nsrc/\\n", prompts[1]
    )


def test_the_flags_reach_the_training_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`python -m mkcode.backend.demo.trainer --tool-sets mixed` and `mkcode demo-model --train
    --tool-sets mixed` train on the mixed sets; without the flag, on mkcode's alone."""
    import argparse

    from mkcode.app.commands import demo

    seen: list[trainer.DemoTrainConfig] = []
    monkeypatch.setattr(trainer, "train_demo_model", lambda out, config, progress: seen.append(config))
    assert (
        trainer.main(["--out", str(tmp_path / "a"), "--steps", "2", "--no-eval", "--tool-sets", "mixed"]) == 0
    )
    assert trainer.main(["--out", str(tmp_path / "b"), "--steps", "2", "--no-eval"]) == 0
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(
        ["--train", "--out", str(tmp_path / "c"), "--steps", "2", "--tool-sets", "mixed"]
    )
    assert demo.run(args) == 0
    assert [c.tool_sets for c in seen] == [vocab.MIXES["mixed"], vocab.MIXES["mkcode"], vocab.MIXES["mixed"]]
    assert all(c.steps == 2 for c in seen)


def test_the_report_has_a_section_per_tool_set(tmp_path: Path) -> None:
    from mkcode.backend.demo import evaluate

    case = evaluate.Case("run", "Run ls in the shell.", {"a.py": "x = 1\n"})
    results = [
        evaluate.EvalResult(
            [evaluate.Outcome(case, calls, "ls shows: a.py.", ok, [], None)], 1.0, "4", tool_set=name
        )
        for name, calls, ok in [
            ("mkcode", [("run_shell", '{"command": "ls"}')], True),
            ("codex", [("exec_command", '{"cmd": "ls"}')], True),
            ("opencode", [], False),
        ]
    ]
    path = evaluate.write_report(tmp_path, results[0], command="CMD", others=results[1:])
    text = path.read_text()
    assert text.startswith("# Demo model 4: held-out evaluation\n") and "Trained with `CMD`" in text
    heads = [line for line in text.split("\n") if line.startswith("## ")]
    assert heads == [
        "## Under codex's tool set",
        "## Under opencode's tool set",
        "## Requests",
        "## Requests under codex's tool set",
        "## Requests under opencode's tool set",
    ]
    assert "exec_command({'cmd': 'ls'})" in text and "| correct tool choice | 0/1 | 0% |" in text
    assert json.loads(json.dumps(evaluate.result_json(results[1])))["requests"][0]["right_tool"] is True


def test_a_timed_out_run_is_recorded_as_a_command_that_reproduces_it(tmp_path) -> None:
    """A run stopped by --max-seconds depends on the machine's speed; its report names the steps it
    ran as --stop-after (the learning-rate schedule still spans --steps), which the CLI accepts."""
    cfg = replace(
        trainer.DemoTrainConfig(), device="cuda", steps=2400, stop_after=2341, tool_sets=vocab.MIXES["mixed"]
    )
    cmd = trainer._command(cfg)
    assert cmd.endswith("--device cuda --steps 2400 --tool-sets mixed --stop-after 2341")
    assert cfg.key()["stop_after"] == 2341 and "max_seconds" not in cfg.key()
    argv = ["--out", str(tmp_path), *cmd.split("--out DIR ")[1].split(), "--no-eval"]
    assert trainer.main(argv) == 2  # parsed; refused only because the directory exists
