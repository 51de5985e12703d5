"""load_settings reads only the mapping it is given."""

from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from storage.settings import EvalLimits, SettingsError, load_settings


def test_defaults():
    settings = load_settings({})
    assert settings.home == Path(platformdirs.user_data_dir("kernelbot"))
    assert settings.default_target == "v6e"
    assert settings.eval_workers == 2
    assert settings.static_profile == "fast"
    assert settings.limits == EvalLimits()


def test_empty_values_mean_defaults():
    env = {"KERNELBOT_HOME": "", "KERNELBOT_EVAL_WORKERS": "", "KERNELBOT_STATIC_PROFILE": ""}
    settings = load_settings(env)
    assert settings.home == Path(platformdirs.user_data_dir("kernelbot"))
    assert settings.eval_workers == 2
    assert settings.static_profile == "fast"


def test_home_is_respected_and_derived_dirs_follow(tmp_path):
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "kb")})
    assert settings.home == tmp_path / "kb"
    assert settings.artifacts_dir == tmp_path / "kb" / "artifacts"
    assert settings.cache_dir == tmp_path / "kb" / "cache"
    settings.ensure_dirs()
    assert sorted(p.name for p in (tmp_path / "kb").iterdir()) == ["artifacts", "cache", "logs"]


def test_home_expands_the_user(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_settings({"KERNELBOT_HOME": "~/kb"}).home == tmp_path / "kb"


def test_overrides():
    settings = load_settings({"KERNELBOT_TARGET": "v5e", "KERNELBOT_EVAL_WORKERS": "8",
                              "KERNELBOT_STATIC_PROFILE": "exact", "KERNELBOT_EVAL_TIMEOUT": "600",
                              "KERNELBOT_EVAL_MEMORY_MIB": "1024"})
    assert (settings.default_target, settings.eval_workers, settings.static_profile) == ("v5e", 8, "exact")
    assert settings.limits.wall_seconds == 600
    assert settings.limits.cpu_seconds == 1800  # three times the wall clock
    assert settings.limits.memory_mib == 1024


def test_the_process_environment_is_not_read_when_a_mapping_is_given(monkeypatch):
    monkeypatch.setenv("KERNELBOT_EVAL_WORKERS", "x")
    assert load_settings({}).eval_workers == 2


@pytest.mark.parametrize(("value", "says"), [("x", "is not a whole number"), ("0", "must be at least 1"),
                                             ("-3", "must be at least 1"), ("2.5", "is not a whole number")])
def test_bad_eval_workers(value, says):
    with pytest.raises(SettingsError) as info:
        load_settings({"KERNELBOT_EVAL_WORKERS": value})
    assert "KERNELBOT_EVAL_WORKERS" in str(info.value)
    assert says in str(info.value)


def test_bad_static_profile():
    with pytest.raises(SettingsError) as info:
        load_settings({"KERNELBOT_STATIC_PROFILE": "slow"})
    message = str(info.value)
    assert "KERNELBOT_STATIC_PROFILE='slow'" in message
    assert "fast, exact" in message


def test_memory_limit_has_a_floor():
    with pytest.raises(SettingsError, match="KERNELBOT_EVAL_MEMORY_MIB=256 must be at least 512"):
        load_settings({"KERNELBOT_EVAL_MEMORY_MIB": "256"})


def test_settings_error_is_a_value_error():
    assert issubclass(SettingsError, ValueError)
