"""Settings layering: config.toml < MKCODE_* environment < flags, with errors that name the source."""

from __future__ import annotations

import argparse

import pytest

from mkcode.app.settings import SettingsError, config_path, data_dir, load_settings


def _flags(**kw) -> argparse.Namespace:
    base = {"model": None, "endpoint": None, "device": None, "mode": None, "theme": None}
    return argparse.Namespace(**{**base, **kw})


def test_defaults_without_file_env_or_flags(tmp_path):
    s = load_settings(None, env={}, path=tmp_path / "missing.toml")
    assert (s.model, s.endpoint, s.mode, s.theme) == (None, None, "ask", "dark")
    assert s.backend == "demo"
    assert s.source_of("mode") == "default"


def test_file_then_env_then_flags(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('model = "/m/file"\nmode = "auto-edit"\ntheme = "light"\n')
    env = {"MKCODE_MODEL": "/m/env", "MKCODE_MODE": "full-auto"}
    s = load_settings(_flags(model="/m/flag"), env=env, path=cfg)
    assert s.model == "/m/flag" and s.source_of("model") == "--model"
    assert s.mode == "full-auto" and s.source_of("mode") == "MKCODE_MODE"
    assert s.theme == "light" and s.source_of("theme") == str(cfg)
    assert s.backend == "local"


def test_endpoint_selects_the_openai_backend(tmp_path):
    s = load_settings(_flags(endpoint="http://h:8000/v1"), env={}, path=tmp_path / "none.toml")
    assert s.backend == "openai"


def test_bad_values_name_their_source(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('mode = "yolo"\n')
    with pytest.raises(SettingsError, match=r"config\.toml: mode must be one of"):
        load_settings(None, env={}, path=cfg)
    cfg.write_text("colour = 1\n")
    with pytest.raises(SettingsError, match="unknown setting"):
        load_settings(None, env={}, path=cfg)
    cfg.write_text("mode = \n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(None, env={}, path=cfg)
    with pytest.raises(SettingsError, match="environment: context_window"):
        load_settings(None, env={"MKCODE_CONTEXT_WINDOW": "lots"}, path=tmp_path / "none.toml")


def test_xdg_locations():
    env = {"XDG_CONFIG_HOME": "/c", "XDG_DATA_HOME": "/d"}
    assert str(config_path(env)) == "/c/mkcode/config.toml"
    assert str(data_dir(env)) == "/d/mkcode"
    assert str(config_path({"MKCODE_CONFIG": "/x.toml"})) == "/x.toml"


def test_sandbox_escape_is_a_flag_only(tmp_path):
    s = load_settings(_flags(dangerously_no_sandbox=True), env={}, path=tmp_path / "none.toml")
    assert s.dangerously_no_sandbox
    assert not load_settings(_flags(), env={"MKCODE_DANGEROUSLY_NO_SANDBOX": "1"}).dangerously_no_sandbox


def test_sandbox_lists_come_from_the_config_file_and_are_checked(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('sandbox_env_allow = ["AWS_REGION", "MYAPP_*"]\nsandbox_home_allow_ro = ["~/.m2"]\n')
    s = load_settings(env={}, path=p)
    assert s.sandbox_env_allow == ("AWS_REGION", "MYAPP_*")
    assert s.sandbox_home_allow_ro == ("~/.m2",)
    p.write_text('sandbox_env_allow = ["LD_PRELOAD"]\n')
    with pytest.raises(SettingsError, match="never passed"):
        load_settings(env={}, path=p)
    p.write_text('sandbox_env_allow = "X"\n')
    with pytest.raises(SettingsError, match="list of non-empty strings"):
        load_settings(env={}, path=p)
