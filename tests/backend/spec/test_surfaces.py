"""Speculation on every surface: `mkcode generate` (flags, a `speculative` object per --json result,
the same tokens on and off), the top-level flags and settings (config, environment, flags), the
serve parser, and /metrics' counters."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mkcode.app.cli import build_parser, main
from mkcode.app.settings import SettingsError, load_settings
from mkcode.backend.engine.engine import EngineMetrics
from mkcode.backend.server.metrics import prometheus_text
from tests.backend.checkpoint.tiny import tiny_checkpoint

PROMPT = ",".join(str(t) for t in [5, 6, 7, 8, 9] * 8)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)


def _generate(ckpt, capsys, *extra) -> dict:
    argv = ["generate", "--model", str(ckpt), "--prompt-ids", PROMPT, "--max-tokens", "40", "--json"]
    assert main([*argv, "--device", "cpu", *extra]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_generate_json_speculative_object_and_same_tokens(ckpt, capsys):
    on = _generate(ckpt, capsys)  # on by default
    off = _generate(ckpt, capsys, "--speculative", "off")
    k3 = _generate(ckpt, capsys, "--spec-k", "3")
    assert on["token_ids"] == off["token_ids"] == k3["token_ids"]
    s = on["speculative"]
    assert s["mode"] == "ngram" and s["k"] == 7
    assert set(s) >= {
        "verify_steps",
        "draft_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "tokens_per_verify",
    }
    assert s["draft_tokens"] > 0 and 0 <= s["accepted_tokens"] <= s["draft_tokens"]
    assert off["speculative"]["mode"] == "off" and off["speculative"]["draft_tokens"] == 0
    assert (
        k3["speculative"]["k"] == 3
        and k3["speculative"]["draft_tokens"] <= 3 * k3["speculative"]["verify_steps"]
    )


def test_generate_prompts_file_has_a_speculative_object_per_result(ckpt, tmp_path, capsys):
    f = tmp_path / "reqs.jsonl"
    f.write_text(
        "\n".join(json.dumps({"id": f"r{i}", "prompt_ids": [5, 6, 7, 8, 9] * (4 + i)}) for i in range(3))
    )
    assert (
        main(["generate", "--model", str(ckpt), "--prompts-file", str(f), "--json", "--device", "cpu"]) == 0
    )
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["id"] for r in recs] == ["r0", "r1", "r2"]
    assert all(r["speculative"]["mode"] == "ngram" for r in recs)


@pytest.mark.parametrize("bad", [["--spec-k", "0"], ["--spec-k", "8"], ["--speculative", "eagle"]])
def test_bad_flags_are_refused(bad):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--model", "x", "--prompt", "a", *bad])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "x", *bad])
    with pytest.raises(SystemExit):
        build_parser().parse_args(bad)


def test_top_level_flags_and_settings(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('speculative = "off"\nspec_k = 4\n')
    s = load_settings(env={}, path=cfg)
    assert (s.speculative, s.spec_k, s.source_of("spec_k")) == ("off", 4, str(cfg))
    s = load_settings(env={"MKCODE_SPEC_K": "2"}, path=cfg)
    assert s.spec_k == 2 and s.source_of("spec_k") == "MKCODE_SPEC_K"
    args = build_parser().parse_args(["--speculative", "ngram", "--spec-k", "5"])
    s = load_settings(args, env={}, path=cfg)
    assert (s.speculative, s.spec_k, s.source_of("spec_k")) == ("ngram", 5, "--spec-k")
    s = load_settings(build_parser().parse_args([]), env={}, path=tmp_path / "none.toml")
    assert (s.speculative, s.spec_k) == ("ngram", 7)  # the default
    with pytest.raises(SettingsError, match="spec_k"):
        load_settings(env={"MKCODE_SPEC_K": "9"}, path=cfg)
    with pytest.raises(SettingsError, match="speculative"):
        load_settings(env={"MKCODE_SPECULATIVE": "draft-model"}, path=cfg)
    serve = build_parser().parse_args(["serve", "--model", "x"])
    assert (serve.speculative, serve.spec_k) == ("ngram", 7)


def test_metrics_export_the_speculative_counters():
    m = EngineMetrics(
        spec_verify_steps=10, spec_draft_tokens=50, spec_accepted_tokens=30, decode_sequence_steps=40
    )
    state = SimpleNamespace(engine=SimpleNamespace(metrics=lambda: m), requests_total={})
    text = prometheus_text(state)
    assert "# TYPE mkcode_engine_spec_draft_tokens_total counter" in text
    assert "mkcode_engine_spec_draft_tokens_total 50" in text
    assert "mkcode_engine_spec_accepted_tokens_total 30" in text
    assert "mkcode_engine_spec_verify_steps_total 10" in text
    assert "mkcode_engine_spec_acceptance_rate 0.6" in text


def test_tui_status_bar_shows_accepted_over_drafted():
    from mkcode.app.core.backend import runtime_metrics
    from mkcode.app.tui.widgets.status_bar import Status, render_status

    m = EngineMetrics(spec_draft_tokens=1140, spec_accepted_tokens=812)
    rt = SimpleNamespace(engine=SimpleNamespace(metrics=lambda: m, speculative="ngram"), device=None)
    spec = runtime_metrics(rt).speculative
    assert spec == "spec 812/1140"
    assert "spec 812/1140" in render_status(Status(model="m", spec=spec), 200).plain
    off = SimpleNamespace(engine=SimpleNamespace(metrics=lambda: m, speculative="off"), device=None)
    assert runtime_metrics(off).speculative is None
