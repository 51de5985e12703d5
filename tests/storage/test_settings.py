"""load_settings reads only the mapping it is given."""

from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from storage.settings import TARGETS, VARIABLES, EvalLimits, SettingsError, load_settings


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


def test_a_cache_directory_of_its_own_is_used_and_made(tmp_path):
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "kb"), "KERNELBOT_CACHE_DIR": str(tmp_path / "shared")})
    assert settings.cache_dir == tmp_path / "shared"
    settings.ensure_dirs()
    assert (tmp_path / "shared").is_dir()
    assert sorted(p.name for p in (tmp_path / "kb").iterdir()) == ["artifacts", "logs"]


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


def test_the_reference_lists_exactly_what_load_settings_reads():
    import inspect
    import re

    from storage import settings as module

    readers = [module.load_settings, module._sources, module._timezone, module._cron]
    source = "\n".join(inspect.getsource(f) for f in readers)
    read = set(re.findall(r'"((?:KERNELBOT|SLACK|ANTHROPIC)_[A-Z_]+)"', source))
    assert read == {v.name for v in VARIABLES if v.reader == "settings"}


def test_the_documented_table_is_the_reference():
    section = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `")]
    documented = {name.strip().strip("`"): (default.strip(), meaning.strip()) for name, default, meaning in rows}
    assert documented == {v.name: (v.default, v.meaning) for v in VARIABLES}


def test_the_targets_are_the_chips_the_runner_knows():
    from tpu_runner.hardware import CHIPS

    assert tuple(CHIPS) == TARGETS


def test_a_config_file_sets_defaults_and_the_environment_wins(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('KERNELBOT_TARGET = "v5e"\nKERNELBOT_EVAL_WORKERS = 4\nSLACK_BOT_TOKEN = "xoxb-1"\n')
    settings = load_settings({"KERNELBOT_CONFIG": str(config), "KERNELBOT_EVAL_WORKERS": "8"})
    assert (settings.default_target, settings.eval_workers, settings.slack_bot_token) == ("v5e", 8, "xoxb-1")
    assert settings.config_file == config


def test_bad_config_files_name_the_file_and_the_key(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('KERNELBOT_TARGT = "v5e"\n')
    with pytest.raises(SettingsError, match="unknown setting 'KERNELBOT_TARGT'"):
        load_settings({"KERNELBOT_CONFIG": str(config)})
    config.write_text("KERNELBOT_TARGET = \n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings({"KERNELBOT_CONFIG": str(config)})
    with pytest.raises(SettingsError, match="cannot be read"):
        load_settings({"KERNELBOT_CONFIG": str(tmp_path / "missing.toml")})
    config.write_text('KERNELBOT_TARGET = "v9"\n')
    with pytest.raises(SettingsError, match="KERNELBOT_TARGET='v9' must be one of v5e, v6e, v5p"):
        load_settings({"KERNELBOT_CONFIG": str(config)})


def test_wrong_values_name_the_setting():
    for env, message in [({"KERNELBOT_LOG_LEVEL": "loud"}, "KERNELBOT_LOG_LEVEL"),
                         ({"KERNELBOT_LOG_FORMAT": "xml"}, "KERNELBOT_LOG_FORMAT"),
                         ({"KERNELBOT_TIMEZONE": "Mars/Base"}, "KERNELBOT_TIMEZONE"),
                         ({"KERNELBOT_DIGEST_CRON": "daily"}, "KERNELBOT_DIGEST_CRON")]:
        with pytest.raises(SettingsError, match=message):
            load_settings(env)
    assert load_settings({"KERNELBOT_LOG_LEVEL": "DEBUG"}).log_level == "debug"


def test_the_llm_spend_cap_and_the_price_table_are_settings() -> None:
    settings = load_settings({"KERNELBOT_HOME": "/tmp/x", "KERNELBOT_MAX_COST_USD": "2.5",
                              "KERNELBOT_PRICES": "opus=5/25, claude-opus-4-1=15/75"})
    assert settings.max_cost_usd == 2.5
    assert settings.prices == (("opus", 5.0, 25.0), ("claude-opus-4-1", 15.0, 75.0))
    assert load_settings({"KERNELBOT_HOME": "/tmp/x"}).max_cost_usd == 10.0
    with pytest.raises(SettingsError, match="KERNELBOT_PRICES entry 'opus=5' must be"):
        load_settings({"KERNELBOT_HOME": "/tmp/x", "KERNELBOT_PRICES": "opus=5"})
    with pytest.raises(SettingsError, match="KERNELBOT_MAX_COST_USD='-1' must be a positive amount"):
        load_settings({"KERNELBOT_HOME": "/tmp/x", "KERNELBOT_MAX_COST_USD": "-1"})
