"""The demo model's training side: its data is valid cmd4 and its training forward is the model's
forward; the shipped checkpoint really emits tool calls the parser reads. (Shipping, checksums and
the command are in test_shipped.py.)"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest
import torch

from mkcode.backend.chat.parser import parse_full
from mkcode.backend.chat.template import chat_template
from mkcode.backend.chat.tokenizer import ChatTokenizer
from mkcode.backend.checkpoint.synth import synthetic_config, synthetic_tokenizer, synthetic_weights
from mkcode.backend.demo.dialogues import make_dialogue
from mkcode.backend.demo.forward import Batch, hidden_states, logits_at
from mkcode.backend.demo.trainer import DEMO_GEOMETRY, _tool_schemas
from mkcode.backend.model.reference import ReferenceModel


@pytest.mark.parametrize("dense_moe", [False, True])
def test_training_forward_matches_the_reference_model(dense_moe: bool) -> None:
    """Padded suffixes over a shared prefix, sliding windows that reach into the prefix, sparse and
    dense experts: the same logits as the reference model on each whole sequence."""
    tok = synthetic_tokenizer(4096, 0)
    cfg = synthetic_config("tiny", tok, {**DEMO_GEOMETRY, "sliding_window": 8})
    w = synthetic_weights(cfg, 0)
    model = ReferenceModel(cfg, w)
    g = torch.Generator().manual_seed(0)
    P = 21
    prefix = torch.randint(0, 4000, (P,), generator=g)
    s1, s2 = torch.randint(0, 4000, (17,), generator=g), torch.randint(0, 4000, (5,), generator=g)
    suffix = torch.zeros(2, 17, dtype=torch.long)
    suffix[0], suffix[1, :5] = s1, s2
    xp, xs = hidden_states(cfg, w, Batch(prefix, suffix), dense_moe=dense_moe)
    for row, s in enumerate((s1, s2)):
        ids = torch.cat([prefix, s]).tolist()
        ref = model.all_logits(model.new_cache(len(ids)), ids)
        got = logits_at(cfg, w, torch.cat([xp, xs[row, : len(s)]]))
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_dialogues_are_well_formed_cmd4() -> None:
    tok = ChatTokenizer.from_tokenizer(synthetic_tokenizer(4096, 0), chat_template())
    tools = _tool_schemas()
    names = {t["function"]["name"] for t in tools}
    rng = random.Random(7)
    seen = set()
    for _ in range(40):
        messages = make_dialogue(rng)
        assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
        assert messages[-1]["role"] == "assistant" and messages[-1]["content"]
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            # What the model must write for this turn, parsed as the engine will parse it.
            before = tok.render(messages[:k], tools, add_generation_prompt=True)
            turn = tok.render(messages[: k + 1], tools, add_generation_prompt=False)[len(before) :]
            parsed = parse_full(turn.removesuffix("<|END_OF_TURN_TOKEN|>"))
            assert not parsed.errors
            if m.get("tool_calls"):
                (call,) = parsed.tool_calls
                want = m["tool_calls"][0]["function"]
                assert call.name == want["name"] in names
                assert json.loads(call.arguments) == json.loads(want["arguments"])
                seen.add(call.name)
            else:
                assert parsed.content == m["content"] and not parsed.tool_calls
    assert seen >= {"list_dir", "read_file", "grep", "glob", "edit_file", "run_shell"}


def test_dialogues_vary_file_names_so_answers_must_copy_them() -> None:
    """Most names are fresh per dialogue: the list answer names exactly the listed entries."""
    from mkcode.backend.demo.dialogues import STEMS, task_list, training_project, training_system_prompt

    rng = random.Random(11)
    stems: set[str] = set()
    for _ in range(60):
        p = training_project(rng)
        stems |= {f.rsplit("/", 1)[-1].removesuffix(".py") for f in p.py_files()}
        messages = task_list(rng, p, training_system_prompt(rng))
        listing, answer = messages[-2]["content"], messages[-1]["content"]
        names = [line.split("  ")[0] for line in listing.split("\n")]
        assert answer.endswith(": " + ", ".join(names) + ".")
    assert len(stems - set(STEMS)) > 60


def test_every_answer_names_only_files_the_conversation_showed() -> None:
    """No training answer teaches inventing a file name: each one in an answer was in the request,
    a tool call or a tool's output before it (never only in the system prompt's examples)."""
    from mkcode.backend.demo.dialogues import make_dialogue
    from mkcode.backend.demo.evaluate import invented_names

    rng = random.Random(3)
    for _ in range(300):
        messages = make_dialogue(rng, 2000 if rng.random() < 0.1 else 0)
        seen: list[str] = []
        for m in messages[1:]:
            if m["role"] == "assistant" and m["content"]:
                assert not invented_names(m["content"], seen), (m["content"], seen)
            calls = " ".join(c["function"]["arguments"] for c in m.get("tool_calls") or [])
            seen += re.findall(r"[\w./-]+", m["content"] + " " + calls)


def test_no_training_request_is_a_held_out_phrasing() -> None:
    from mkcode.backend.demo.dialogues import _key, make_dialogue
    from mkcode.backend.demo.evaluate import held_out_cases

    held = {_key(c.request) for c in held_out_cases()}
    rng = random.Random(5)
    seen = set()
    for _ in range(3000):
        messages = make_dialogue(rng)
        seen |= {_key(m["content"]) for m in messages if m["role"] == "user"}
    assert len(seen) > 2500  # varied phrasings
    assert not (seen & held)
    # phrasings are filtered at the template level too: no held-out form with other names
    from mkcode.backend.demo.dialogues import HELD_OUT_KEYS

    assert HELD_OUT_KEYS and "please run the tests" in HELD_OUT_KEYS


def test_tool_outputs_in_the_dialogues_are_what_the_real_tools_return(tmp_path: Path) -> None:
    """The imitated outputs (listing, numbered read, grep hits, the edit diff, errors) equal the
    tools' own output on the same project written to disk."""
    from mkcode.backend.demo.dialogues import (
        task_edit,
        task_find,
        task_list,
        task_read,
        task_read_missing,
        training_project,
        training_system_prompt,
    )
    from mkcode.tools import ToolRegistry, Workspace

    rng = random.Random(21)
    checked: set[str] = set()
    for k in range(40):
        p = training_project(rng)
        root = tmp_path / str(k)
        for rel, text in p.files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        registry = ToolRegistry(Workspace(str(root)), mode="full-auto")
        task = (task_list, task_read, task_find, task_edit, task_read_missing)[k % 5]
        messages = task(rng, p, training_system_prompt(rng))
        for m, result in itertools.pairwise(messages):
            if m["role"] != "assistant" or not m.get("tool_calls"):
                continue
            fn = m["tool_calls"][0]["function"]
            got = registry.execute(fn["name"], fn["arguments"]).for_model()
            assert got == result["content"], (fn, got, result["content"])
            checked.add(fn["name"])
    assert checked >= {"list_dir", "read_file", "grep", "edit_file"}


def test_encoding_the_suffix_alone_equals_encoding_the_whole_dialogue() -> None:
    from mkcode.backend.demo import trainer
    from mkcode.backend.demo.dialogues import make_dialogue

    tools = _tool_schemas()
    trainer._init_data(trainer.demo_tokenizer().to_str(), tools)
    tok = trainer._W["tok"]
    rng = random.Random(2)
    for i in range(8):
        messages = make_dialogue(rng, 3000 if i % 4 == 0 else 0)
        suffix, targets = trainer.encode_dialogue(messages)
        assert (
            tok.apply_chat_template(messages, tools, add_generation_prompt=False)
            == trainer._W["prefix"] + suffix
        )
        text = tok.decode([suffix[i] for i in targets])
        assert text.count("<|END_OF_TURN_TOKEN|>") == sum(m["role"] == "assistant" for m in messages)
        assert "<|USER_TOKEN|>" not in text and "<|START_TOOL_RESULT|>" not in text


def test_the_training_prompt_holds_the_agents_own_instructions() -> None:
    from mkcode.app.agent.prompt import DEFAULT_INSTRUCTIONS
    from mkcode.backend.demo.dialogues import AGENT_INSTRUCTIONS

    assert AGENT_INSTRUCTIONS == DEFAULT_INSTRUCTIONS


def test_long_training_prompts_reach_the_agents_prompt_sizes() -> None:
    """Some training dialogues sit behind a system prompt as long as OpenCode's (~10.4K tokens)."""
    from mkcode.backend.demo import trainer
    from mkcode.backend.demo.dialogues import long_instructions

    tok = ChatTokenizer.from_tokenizer(trainer.demo_tokenizer(), chat_template())
    hi = trainer.DemoTrainConfig().long_chars[1]
    n = len(tok.encode(long_instructions(random.Random(0), hi)))
    assert 10_400 < n < 32_768 - 4_000


@pytest.mark.slow
def test_batches_do_not_depend_on_the_number_of_workers() -> None:
    from dataclasses import replace

    from mkcode.backend.demo import trainer

    config = replace(trainer.DemoTrainConfig(), steps=4, batch_size=3, long_every=2, long_chars=(2000, 3000))
    tools, tj = _tool_schemas(), trainer.demo_tokenizer().to_str()
    inline = list(trainer.batches(config, tj, tools))
    pooled = list(trainer.batches(replace(config, workers=2), tj, tools))
    assert inline == pooled
    assert [len(rows) for _prefix, rows in inline] == [3, config.long_batch, 3, config.long_batch]
    mixed = replace(config, tool_sets=(("opencode", 1.0), ("codex", 1.0), ("renamed", 1.0)))
    assert list(trainer.batches(mixed, tj, tools)) == list(
        trainer.batches(replace(mixed, workers=2), tj, tools)
    )


@pytest.mark.slow
def test_trained_demo_model_emits_parseable_tool_calls(demo_model: Path) -> None:
    from mkcode.backend.checkpoint.loader import load_checkpoint
    from mkcode.backend.demo.evaluate import tool_call_rate

    files = {p.name for p in demo_model.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"} <= files
    ck = load_checkpoint(demo_model, device="cpu", dtype=torch.float32, progress=False)
    assert ck.config.to_hf_dict()["model_type"] == "cohere2_moe"
    tok = ChatTokenizer(demo_model)
    result = tool_call_rate(ck.config, ck.weights, tok, _tool_schemas(), seed=4242, n=6)
    assert result["valid"] >= 5, json.dumps(result["samples"], indent=1)


@pytest.mark.parametrize(("tool_set", "kept"), [("mkcode", True), ("codex", False)])
def test_the_evaluation_keeps_the_plan_in_the_history_as_mkcodes_agent_does(
    monkeypatch: pytest.MonkeyPatch, tool_set: str, kept: bool
) -> None:
    """mkcode's agent keeps a tool call's reasoning in the history (app/agent/loop.py), and the
    training dialogues do too; an OpenAI-wire client drops it. The held-out evaluation must replay
    the history the way the client it stands for does, or it measures the wrong model."""
    from types import SimpleNamespace

    from mkcode.backend.demo import evaluate as ev

    plan = "I will read a.py first, then rename f to g."
    name = {"mkcode": "read_file", "codex": "exec_command"}[tool_set]
    args = {"mkcode": {"path": "a.py"}, "codex": {"cmd": "cat a.py"}}[tool_set]
    call = json.dumps([{"tool_call_id": "0", "tool_name": name, "parameters": args}])
    outputs = iter(
        [
            f"<|START_THINKING|>{plan}<|END_THINKING|><|START_ACTION|>{call}<|END_ACTION|>",
            "<|START_RESPONSE|>Renamed f to g in a.py.<|END_RESPONSE|>",
        ]
    )
    seen: list[list[dict]] = []

    class Tok:
        eos_token_ids = (0,)

        def apply_chat_template(self, messages, tools, add_generation_prompt):
            seen.append(json.loads(json.dumps(messages)))
            return [1]

        def decode(self, ids, skip_special_tokens):
            return next(outputs)

    monkeypatch.setattr(ev, "greedy", lambda cfg, w, ids, eos, n: [2])
    case = ev.Case(
        "edit", "Rename f to g in a.py.", {"a.py": "def f():\n    return 1\n"}, ("a.py", "def f(", "def g(")
    )
    out = ev.run_case(SimpleNamespace(cfg=None, weights=None), Tok(), case, tool_set=tool_set)
    assert out.answer == "Renamed f to g in a.py." and len(seen) == 2
    turn = next(m for m in seen[1] if m["role"] == "assistant")
    assert turn["tool_calls"][0]["function"]["name"] == name
    assert turn.get("reasoning_content") == (plan if kept else None)


def test_init_from_starts_at_the_given_checkpoint_and_refuses_another_geometry(tmp_path: Path) -> None:
    """`--init-from` loads the shipped weights (the key records its version and weights hash, not
    its path); a checkpoint of another geometry is a clear error, never a silent reshape."""
    from dataclasses import replace

    from mkcode.backend.demo import trainer
    from mkcode.backend.demo.shipped import SHIPPED_DIR, sha256_file

    raw_tok = trainer.demo_tokenizer()
    cfg = synthetic_config("tiny", raw_tok, trainer.DEMO_GEOMETRY)
    config = replace(trainer.DemoTrainConfig(), init_from=str(SHIPPED_DIR))
    got = trainer.initial_weights(cfg, config).state_dict(cfg)
    fresh = synthetic_weights(cfg, 0).state_dict(cfg)
    assert got.keys() == fresh.keys()
    assert not torch.equal(got["model.embed_tokens.weight"], fresh["model.embed_tokens.weight"])
    key = config.key()
    assert "init_from" not in key
    version = (SHIPPED_DIR / "VERSION").read_text().strip()
    assert key["init"] == {"version": version, "sha256": sha256_file(SHIPPED_DIR / "model.safetensors")}
    other = tmp_path / "other"
    small = synthetic_config("tiny", raw_tok, {**trainer.DEMO_GEOMETRY, "hidden_size": 128})
    trainer.write_checkpoint(other, small, synthetic_weights(small, 0), raw_tok)
    with pytest.raises(ValueError, match="not the demo geometry"):
        trainer.initial_weights(cfg, replace(config, init_from=str(other)))
