"""The chat template (cmd4 format) and a renderer with transformers' ``apply_chat_template`` semantics.

``chat_template()`` returns the Jinja source shipped in a checkpoint's ``tokenizer_config.json``. For
OpenAI-shaped messages it renders exactly what ``cohere_melody.render_cmd4`` renders for the config that
``to_melody_config`` builds from the same messages (the parity is property-tested), so the model sees the
prompt format it was trained on whether the prompt is built by mkcode, by transformers, or by Melody.

``render_chat`` renders a template the way transformers does (same sandboxed Jinja environment, filters
and globals, same message normalisation), without importing transformers. Unlike transformers it also
parses tool-call ``arguments`` given as JSON strings (the OpenAI wire shape) into objects first, as
vLLM does, so the template re-serialises them canonically, as Melody does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from importlib import resources
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.chat.melody_config import to_melody_config

__all__ = ["chat_template", "compile_template", "normalize_messages", "render_chat", "to_melody_config"]

_TEMPLATE_FILE = "cmd4_template.jinja"

# Reasoning is accepted under these names; the first present one wins (transformers' order).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def chat_template() -> str:
    """Return the Jinja chat template for the cmd4 format (the text to store as ``chat_template``).

    Template variables: ``messages`` (OpenAI-shaped: roles system/developer, user, assistant with optional
    ``tool_calls`` and ``reasoning_content``/``reasoning``/``thinking``, tool with ``tool_call_id``),
    ``tools`` (OpenAI tool schemas), ``add_generation_prompt``, ``bos_token`` and ``grounding``
    (``"enabled"``/``True`` adds Cohere's grounding preamble when tools are given; off by default).
    """
    return _template_text()


@lru_cache(maxsize=1)
def _template_text() -> str:
    return resources.files("mkcode.backend.chat").joinpath(_TEMPLATE_FILE).read_text(encoding="utf-8")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain ``json.dumps`` (no HTML escaping), non-ASCII kept."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """A ``namespace`` that refuses underscore-prefixed attributes, as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as jinja2's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """Compile ``template`` in the environment transformers' ``apply_chat_template`` uses (cached)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = dict
    env.globals["namespace"] = _Namespace
    return env.from_string(template)


def _parse_arguments(arguments: Any) -> Any:
    """Parse a JSON-string ``arguments`` into an object; leave anything else (or bad JSON) untouched."""
    if isinstance(arguments, str) and arguments.strip():
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _normalize_tool_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    call = dict(call)
    fn = call.get("function")
    if isinstance(fn, Mapping) and "arguments" in fn:
        call["function"] = {**fn, "arguments": _parse_arguments(fn["arguments"])}
    elif "arguments" in call:
        call["arguments"] = _parse_arguments(call["arguments"])
    return call


def normalize_messages(
    messages: Sequence[Mapping[str, Any]], parse_arguments: bool = True
) -> list[dict[str, Any]]:
    """Normalise messages as transformers does before rendering, plus argument parsing.

    Keys whose value is ``None`` are dropped; reasoning given under any accepted name is copied to
    ``reasoning_content`` and ``thinking``; with ``parse_arguments``, JSON-string tool-call arguments
    become objects. The input is not modified.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {message!r}")
        msg = {k: v for k, v in message.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if k in msg), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        if parse_arguments and isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [_normalize_tool_call(c) for c in msg["tool_calls"]]
        out.append(msg)
    return out


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kw: Any,
) -> str:
    """Render ``template`` for ``messages`` as transformers' ``apply_chat_template(tokenize=False)`` does.

    Extra keyword arguments become template variables (e.g. ``grounding="enabled"``). ``bos_token`` and
    ``eos_token`` default to Cohere's, as a tokenizer would pass them. Raises
    ``jinja2.exceptions.TemplateError`` for conversations the template rejects.
    """
    kw.setdefault("bos_token", st.BOS_TOKEN)
    kw.setdefault("eos_token", st.EOS_TOKEN)
    compiled = compile_template(template)
    return compiled.render(
        messages=normalize_messages(messages),
        tools=list(tools) if tools is not None else None,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **kw,
    )
