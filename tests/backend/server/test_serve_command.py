"""`mkcode serve` flags and the client configurations it prints."""

from __future__ import annotations

import argparse
import json

import pytest

from mkcode.app.cli import main


def _checkpoint(tmp_path, context: int):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": context}))
    return str(tmp_path)


def test_print_opencode_config(capsys, tmp_path):
    argv = ["serve", "--print-opencode-config", "--served-model-name", "north", "--port", "9000"]
    assert main([*argv, "--model", _checkpoint(tmp_path, 32768)]) == 0
    cfg = json.loads(capsys.readouterr().out)
    provider = cfg["provider"]["mkcode"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:9000/v1"
    assert provider["models"]["north"]["tool_call"] is True
    # the served model's context; the output limit is the server's default cap for it
    assert provider["models"]["north"]["limit"] == {"context": 32768, "output": 8192}
    assert cfg["model"] == "mkcode/north"
    assert main([*argv, "--max-model-len", "8192", "--default-max-tokens", "1000"]) == 0
    limit = json.loads(capsys.readouterr().out)["provider"]["mkcode"]["models"]["north"]["limit"]
    assert limit == {"context": 8192, "output": 1000}


def test_print_codex_config(capsys, tmp_path):
    argv = ["serve", "--print-codex-config", "--served-model-name", "north"]
    assert main([*argv, "--model", _checkpoint(tmp_path, 32768)]) == 0
    out = capsys.readouterr().out
    assert 'wire_api = "responses"' in out and 'base_url = "http://127.0.0.1:8080/v1"' in out
    assert "model_context_window = 32768\n" in out
    assert "model_auto_compact_token_limit = 24576\n" in out  # room for the 8192-token output cap
    tomllib = pytest.importorskip("tomllib")
    cfg = tomllib.loads(out)
    assert cfg["model"] == "north" and cfg["model_providers"]["mkcode"]["wire_api"] == "responses"


def test_served_model_names_and_output_cap_reach_the_server(monkeypatch, tmp_path):
    """--served-model-name twice gives an alias; --default-max-tokens the server's output cap; the
    parallel launcher forwards every name."""
    from mkcode.app.commands import serve

    seen = {}

    def fake_app(rt, options=None):
        seen["options"] = options
        return object()

    monkeypatch.setattr("mkcode.backend.server.create_app", fake_app)
    serve.register(argparse.ArgumentParser().add_subparsers())
    args = serve._PARSER.parse_args(
        [
            "--model",
            str(tmp_path),
            "--served-model-name",
            "a",
            "--served-model-name",
            "b",
            "--default-max-tokens",
            "300",
        ]
    )
    rt = type("Rt", (), {"decode_backend": "torch", "decode_note": "test"})()
    serve._app(rt, args, serve._served_name(args), None, "http://x/v1")
    options = seen["options"]
    assert options.served_model_name == "a" and options.model_aliases == ("b",)
    assert options.default_max_tokens == 300
    argv = serve._forwarded_argv(args, "a")
    assert argv[argv.index("--served-model-name") :][:4] == [
        "--served-model-name",
        "a",
        "--served-model-name",
        "b",
    ]


def test_serve_needs_a_model(capsys):
    assert main(["serve"]) == 2
    assert "--model is required" in capsys.readouterr().err
