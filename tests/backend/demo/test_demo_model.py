"""The demo model's training side: its data is valid cmd4 and its training forward is the model's
forward; the shipped checkpoint really emits tool calls the parser reads. (Shipping, checksums and
the command are in test_shipped.py.)"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from mkcode.backend.chat.parser import parse_full
from mkcode.backend.chat.template import chat_template
from mkcode.backend.chat.tokenizer import ChatTokenizer
from mkcode.backend.checkpoint.synth import synthetic_config, synthetic_tokenizer, synthetic_weights
from mkcode.backend.demo.dialogues import make_dialogue
from mkcode.backend.demo.forward import PackedBatch, hidden_states, logits_at
from mkcode.backend.demo.trainer import DEMO_GEOMETRY, _tool_schemas
from mkcode.backend.model.reference import ReferenceModel


def test_training_forward_matches_the_reference_model() -> None:
    tok = synthetic_tokenizer(4096, 0)
    cfg = synthetic_config("tiny", tok, {**DEMO_GEOMETRY, "sliding_window": 8})
    w = synthetic_weights(cfg, 0)
    model = ReferenceModel(cfg, w)
    g = torch.Generator().manual_seed(0)
    P = 21
    prefix = torch.randint(0, 4000, (P,), generator=g)
    s1, s2 = torch.randint(0, 4000, (17,), generator=g), torch.randint(0, 4000, (5,), generator=g)
    x = hidden_states(cfg, w, PackedBatch(prefix, torch.cat([s1, s2]), [17, 5]))
    for s, off in ((s1, P), (s2, P + 17)):
        ids = torch.cat([prefix, s]).tolist()
        ref = model.all_logits(model.new_cache(len(ids)), ids)
        rows = torch.cat([torch.arange(P), torch.arange(off, off + len(s))])
        torch.testing.assert_close(logits_at(cfg, w, x, rows), ref, atol=1e-4, rtol=1e-4)


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
    """Half the names are made up per dialogue: the list answer names exactly the listed entries."""
    from mkcode.backend.demo.dialogues import STEMS, make_project, system_prompt, task_list

    rng = random.Random(11)
    stems: set[str] = set()
    for _ in range(60):
        p = make_project(rng)
        stems |= {f.rsplit("/", 1)[-1].removesuffix(".py") for f in p.py_files()}
        messages = task_list(rng, p, system_prompt(rng))
        listing, answer = messages[-2]["content"], messages[-1]["content"]
        names = [line.split("  ")[0] for line in listing.split("\n")]
        assert answer.endswith(", ".join(names) + ".")
    assert len(stems - set(STEMS)) > 30


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
