"""Client configuration for coding agents pointed at `mkcode serve`: OpenCode and Codex CLI."""

from __future__ import annotations

import json
from typing import Any

PROVIDER_ID = "mkcode"


def opencode_config(
    base_url: str, model: str, *, context: int, output: int, api_key_env: str | None = "MKCODE_API_KEY"
) -> dict[str, Any]:
    """An opencode.json that uses the server through `@ai-sdk/openai-compatible` (Chat Completions).

    `limit.output` keeps OpenCode from asking for its default 32000 tokens; `interleaved` makes it
    send earlier reasoning back as `reasoning_content`, which the chat template renders as the plan.
    """
    options: dict[str, Any] = {"baseURL": base_url}
    if api_key_env:
        options["apiKey"] = "{env:" + api_key_env + "}"
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "mkcode (local)",
                "options": options,
                "models": {
                    model: {
                        "name": f"{model} (mkcode)",
                        "limit": {"context": context, "output": output},
                        "tool_call": True,
                        "reasoning": True,
                        "attachment": False,
                        "temperature": True,
                        "interleaved": {"field": "reasoning_content"},
                    }
                },
            }
        },
        "model": f"{PROVIDER_ID}/{model}",
        "small_model": f"{PROVIDER_ID}/{model}",
    }


def codex_config(base_url: str, model: str, *, api_key_env: str = "MKCODE_API_KEY") -> str:
    """A ~/.codex/config.toml fragment: a custom provider speaking the Responses API."""
    q = json.dumps  # TOML basic strings accept JSON string escapes
    return (
        f"model = {q(model)}\n"
        f'model_provider = "{PROVIDER_ID}"\n\n'
        f"[model_providers.{PROVIDER_ID}]\n"
        f'name = "mkcode (local)"\n'
        f"base_url = {q(base_url)}\n"
        f'wire_api = "responses"\n'
        f"env_key = {q(api_key_env)}\n"
    )
