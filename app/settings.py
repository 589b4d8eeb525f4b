"""User settings: `~/.config/mkcode/config.toml`, then `MKCODE_*` environment variables, then flags.

Each layer overrides the one before it, field by field; `Settings.sources` says where every value
came from, so the UI can say "model from config.toml" or "endpoint from MKCODE_ENDPOINT".

    # ~/.config/mkcode/config.toml
    model = "/models/north-mini-code"   # checkpoint directory (in-process engine)
    endpoint = "http://gpu-box:8000/v1" # or: drive an OpenAI-compatible server instead
    endpoint_model = "north-mini-code"
    mode = "ask"                         # ask | auto-edit | full-auto
    theme = "dark"                       # dark | light
    sandbox_env_allow = ["AWS_REGION", "MYAPP_*"]  # more variables for sandboxed commands
    sandbox_home_allow_ro = ["~/.m2/repository"]  # more of $HOME visible (read-only) in the sandbox

Imports stay light (no torch, no textual): this module is on the `mkcode --help` path.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MODES = ("ask", "auto-edit", "full-auto")
THEMES = ("dark", "light")
DECODES = ("auto", "torch", "graph", "megakernel", "hybrid")  # = backend.runtime.DECODE_BACKENDS
SPECULATIVE = ("off", "ngram")  # = backend.engine.engine.SPECULATIVE_MODES
SPEC_K_MAX = 7  # = backend.spec.drafter.MAX_DRAFTS

# config.toml key / settings field -> environment variable.
ENV_VARS: dict[str, str] = {
    "model": "MKCODE_MODEL",
    "endpoint": "MKCODE_ENDPOINT",
    "endpoint_model": "MKCODE_ENDPOINT_MODEL",
    "api_key": "MKCODE_API_KEY",
    "device": "MKCODE_DEVICE",
    "decode": "MKCODE_DECODE",
    "mode": "MKCODE_MODE",
    "theme": "MKCODE_THEME",
    "context_window": "MKCODE_CONTEXT_WINDOW",
    "max_tokens": "MKCODE_MAX_TOKENS",
    "speculative": "MKCODE_SPECULATIVE",
    "spec_k": "MKCODE_SPEC_K",
}


# List settings: config.toml only (a list has no unambiguous environment spelling).
LIST_KEYS = ("sandbox_env_allow", "sandbox_home_allow_ro")


class SettingsError(ValueError):
    """A bad value in the config file, the environment or the flags; the message names the source."""


@dataclass
class Settings:
    model: str | None = None  # checkpoint directory for the in-process engine
    endpoint: str | None = None  # OpenAI-compatible base URL (…/v1); wins over `model`
    endpoint_model: str = "north-mini-code"  # model id sent to the endpoint
    api_key: str | None = None
    device: str | None = None  # cpu | cuda | cuda:N (default: cuda when present)
    decode: str = "auto"
    mode: str = "ask"
    theme: str = "dark"
    context_window: int = 32_768  # used for remote endpoints (the local engine knows its own)
    max_tokens: int = 4096  # answer tokens per model call
    speculative: str = "ngram"  # in-process engine: prompt-lookup drafts (off | ngram)
    spec_k: int = SPEC_K_MAX  # most drafts per step (1..7)
    dangerously_no_sandbox: bool = False  # flag only: never read from a file or the environment
    sandbox_env_allow: tuple[str, ...] = ()  # variable names (or PREFIX*) passed to sandboxed commands
    sandbox_home_allow_ro: tuple[str, ...] = ()  # folders under $HOME visible read-only in the sandbox
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def backend(self) -> str:
        """`openai` (remote endpoint), `local` (a checkpoint) or `demo` (nothing configured)."""
        if self.endpoint:
            return "openai"
        return "local" if self.model else "demo"

    def source_of(self, name: str) -> str:
        return self.sources.get(name, "default")


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "mkcode"


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where sessions live: `$XDG_DATA_HOME/mkcode` (default `~/.local/share/mkcode`)."""
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "mkcode"


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env["MKCODE_CONFIG"]) if env.get("MKCODE_CONFIG") else config_dir(env) / "config.toml"


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check and convert one value; errors name the field and where it came from."""
    if name in LIST_KEYS:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise SettingsError(f"{source}: {name} must be a list of non-empty strings, got {value!r}")
        if name == "sandbox_env_allow":
            from mkcode.tools.sandbox.env import check_allow_list

            problems = check_allow_list(value)
            if problems:
                raise SettingsError(f"{source}: sandbox_env_allow: {'; '.join(problems)}")
        return tuple(value)
    if name in ("context_window", "max_tokens", "spec_k"):
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise SettingsError(f"{source}: {name} must be an integer, got {value!r}") from None
        if n < 1 or (name == "context_window" and n < 256):
            raise SettingsError(f"{source}: {name} is too small ({n})")
        if name == "spec_k" and n > SPEC_K_MAX:
            raise SettingsError(f"{source}: spec_k must be at most {SPEC_K_MAX} ({n})")
        return n
    if not isinstance(value, str):
        raise SettingsError(f"{source}: {name} must be a string, got {type(value).__name__}")
    allowed = {"mode": MODES, "theme": THEMES, "decode": DECODES, "speculative": SPECULATIVE}.get(name)
    if allowed is not None and value not in allowed:
        raise SettingsError(f"{source}: {name} must be one of {', '.join(allowed)}; got {value!r}")
    if name == "model":
        return str(Path(value).expanduser())
    return value


def _apply(settings: Settings, values: Mapping[str, Any], source: str) -> None:
    for name, value in values.items():
        if value is None or value == "":
            continue
        setattr(settings, name, _coerce(name, value, source))
        settings.sources[name] = source


def read_config_file(path: Path) -> dict[str, Any]:
    """The known keys of a config.toml (missing file: empty); unknown keys are an error."""
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SettingsError(f"{path}: not valid TOML ({e})") from None
    known = set(ENV_VARS) | set(LIST_KEYS)
    unknown = sorted(set(data) - known)
    if unknown:
        raise SettingsError(f"{path}: unknown setting(s) {unknown}; known: {sorted(known)}")
    return data


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the top-level flags set (None where a flag was not given)."""
    return {
        "model": getattr(args, "model", None),
        "endpoint": getattr(args, "endpoint", None),
        "device": getattr(args, "device", None),
        "mode": getattr(args, "mode", None),
        "theme": getattr(args, "theme", None),
        "speculative": getattr(args, "speculative", None),
        "spec_k": getattr(args, "spec_k", None),
    }


def load_settings(
    args: argparse.Namespace | None = None,
    *,
    env: Mapping[str, str] | None = None,
    path: Path | None = None,
) -> Settings:
    """Defaults < config file < environment < flags."""
    env = os.environ if env is None else env
    path = path or config_path(env)
    settings = Settings()
    _apply(settings, read_config_file(path), str(path))
    _apply(settings, {name: env.get(var) for name, var in ENV_VARS.items()}, "environment")
    for name, var in ENV_VARS.items():
        if settings.sources.get(name) == "environment":
            settings.sources[name] = var
    if args is not None:
        flags = flag_values(args)
        _apply(settings, flags, "flag")
        for name in flags:
            if settings.sources.get(name) == "flag":
                settings.sources[name] = f"--{name.replace('_', '-')}"
        settings.dangerously_no_sandbox = bool(getattr(args, "dangerously_no_sandbox", False))
    return settings


def spec_k_arg(value: str) -> int:
    """argparse type of --spec-k: an integer in [1, SPEC_K_MAX]."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--spec-k must be an integer, got {value!r}") from None
    if not 1 <= n <= SPEC_K_MAX:
        raise argparse.ArgumentTypeError(f"--spec-k must be in [1, {SPEC_K_MAX}], got {n}")
    return n


def add_speculative_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: bool) -> None:
    """`--speculative off|ngram` and `--spec-k N`, the same on every entry point (defaults: ngram,
    7; `default=False` leaves them None so that config.toml and the environment can fill them)."""
    parser.add_argument(
        "--speculative",
        choices=SPECULATIVE,
        default="ngram" if default else None,
        help="speculative decoding: ngram (prompt-lookup drafts, the default) or off",
    )
    parser.add_argument(
        "--spec-k",
        type=spec_k_arg,
        default=SPEC_K_MAX if default else None,
        metavar="N",
        help=f"most draft tokens verified per step (1..{SPEC_K_MAX}, default {SPEC_K_MAX})",
    )


def setting_names() -> list[str]:
    return [f.name for f in fields(Settings) if f.name != "sources"]
