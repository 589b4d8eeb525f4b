"""`mkcode serve` flags and the client configurations it prints."""

from __future__ import annotations

import json

from mkcode.app.cli import main


def test_print_opencode_config(capsys):
    assert main(["serve", "--print-opencode-config", "--served-model-name", "north", "--port", "9000"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    provider = cfg["provider"]["mkcode"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:9000/v1"
    assert provider["models"]["north"]["tool_call"] is True
    assert cfg["model"] == "mkcode/north"


def test_print_codex_config(capsys):
    assert main(["serve", "--print-codex-config", "--served-model-name", "north"]) == 0
    out = capsys.readouterr().out
    assert 'wire_api = "responses"' in out and 'base_url = "http://127.0.0.1:8080/v1"' in out


def test_serve_needs_a_model(capsys):
    assert main(["serve"]) == 2
    assert "--model is required" in capsys.readouterr().err
