"""Client configuration for coding agents pointed at `mkcode serve`: OpenCode and Codex CLI."""

from __future__ import annotations

import json
from typing import Any

PROVIDER_ID = "mkcode"


def opencode_config(
    base_url: str, model: str, *, context: int, output: int, api_key_env: str | None = "MKCODE_API_KEY"
) -> dict[str, Any]:
    """An opencode.json that uses the server through `@ai-sdk/openai-compatible` (Chat Completions).

    `limit.context` is the served model's context (OpenCode compacts before it); `limit.output`
    keeps OpenCode from asking for its default 32000 tokens; `interleaved` makes it
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


def codex_config(
    base_url: str,
    model: str,
    *,
    context: int | None = None,
    output: int | None = None,
    api_key_env: str = "MKCODE_API_KEY",
) -> str:
    """A ~/.codex/config.toml fragment: a custom provider speaking the Responses API.

    Codex has no setting for the output limit (it sends no `max_output_tokens`; the server's default
    output cap bounds its answers), so with `context` it gets the context window, and a compaction
    threshold that leaves `output` tokens of room for the answer."""
    q = json.dumps  # TOML basic strings accept JSON string escapes
    limits = ""
    if context:
        limits = f"model_context_window = {int(context)}\n"
        if output:
            limits += f"model_auto_compact_token_limit = {max(1, int(context) - int(output))}\n"
    return (
        f"model = {q(model)}\n"
        f'model_provider = "{PROVIDER_ID}"\n'
        f"{limits}\n"
        f"[model_providers.{PROVIDER_ID}]\n"
        f'name = "mkcode (local)"\n'
        f"base_url = {q(base_url)}\n"
        f'wire_api = "responses"\n'
        f"env_key = {q(api_key_env)}\n"
    )
