"""`kernelbot doctor` on this machine: the real toolchain, a real compile, real databases, and the fakes of Slack
and Anthropic for the real SDKs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest

from bot.cli.checks.anthropic import check_anthropic
from bot.cli.checks.compile import check_compile
from bot.cli.checks.database import check_database
from bot.cli.checks.install import (
    check_hardware,
    check_libtpu,
    check_python,
    check_settings,
    libtpu_requirement,
    version_matches,
)
from bot.cli.checks.report import Check, as_json, exit_code, render_checks
from bot.cli.checks.run import run_checks
from bot.cli.checks.slack import MANIFEST, SLACK_SCOPES, check_slack, check_slack_scopes, manifest_scopes
from storage.connect import open_database
from storage.engine import make_engine
from storage.migrate import head_revision, upgrade
from storage.settings import Settings, load_settings
from tests.fakes.anthropic_api import API_KEY, MODELS, fake_anthropic
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack, fake_slack
from tests.storage.conftest import fresh_database_url

KERNELBOT = str(Path(sys.executable).parent / "kernelbot")
SIGNING_SECRET = "0123456789abcdef" * 2  # the shape of a Slack signing secret: 32 hex digits
LINE = re.compile(r"^(ok|warn|FAIL|skip)\s+(.+?)\s{2,}(.*)$")


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Only what the case needs: no config file, no tokens, a data directory of its own."""
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "KERNELBOT_HOME": str(tmp_path / "home"), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", **extra}


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KERNELBOT, "doctor", *args], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[3])


def _rows(text: str) -> dict[str, tuple[str, str]]:
    """name -> (status, detail) from doctor's text output."""
    return {m[2]: (m[1], m[3]) for m in map(LINE.match, text.splitlines()) if m}


def _settings(tmp_path: Path, **env: str) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), **env})


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


# -- the command on this machine -----------------------------------------------------------------------------------

def test_everything_that_can_pass_here_passes_and_the_hardware_is_cpu_only(tmp_path: Path) -> None:
    open_database(_settings(tmp_path)).dispose()  # a local database, migrated as `serve` would leave it
    proc = _doctor(_clean_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(proc.stdout)
    for name in ("python", "kernelbot", "jax", "libtpu", "settings", "database", "compile"):
        assert rows[name][0] == "ok", (name, proc.stdout)
    assert metadata.version("libtpu") in rows["libtpu"][1] and metadata.version("jaxlib") in rows["jax"][1]
    assert "from the environment (no config file)" in rows["settings"][1]
    assert f"at the schema head {head_revision()}" in rows["database"][1]
    assert rows["compile"][1].startswith("a Pallas kernel compiled ahead of time for v6e (v6e=1x1) with libtpu")
    assert rows["hardware"][0] == "warn" and "CPU only" in rows["hardware"][1] and "`estimated`" in rows["hardware"][1]
    assert rows["slack"][0] == "skip" and "SLACK_BOT_TOKEN is not set" in rows["slack"][1]
    assert rows["anthropic"][0] == "skip" and "ANTHROPIC_API_KEY is not set" in rows["anthropic"][1]
    assert "fix: nothing to fix for estimates" in proc.stdout  # the warning explains itself
    assert proc.stdout.strip().splitlines()[-1].endswith("ready (with warnings)")


def test_a_bad_setting_fails_naming_the_variable_and_exits_1(tmp_path: Path) -> None:
    proc = _doctor(_clean_env(tmp_path, KERNELBOT_TARGET="v9"), "--json", "--skip-compile")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ready"] is False and report["exit_code"] == 1
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks["settings"]) >= {"status", "detail", "fix", "needed", "blocking"}
    assert checks["settings"]["status"] == "fail" and checks["settings"]["blocking"]
    assert "KERNELBOT_TARGET='v9'" in checks["settings"]["detail"] and "v6e" in checks["settings"]["detail"]
    assert "KERNELBOT_TARGET" in checks["settings"]["fix"]
    assert checks["python"]["status"] == "ok" and checks["hardware"]["status"] == "warn"
    assert {checks[n]["status"] for n in ("database", "compile", "slack", "anthropic")} == {"skip"}
    assert "settings failed" in report["summary"]


def test_a_configured_slack_token_that_slack_refuses_makes_the_exit_code_1(tmp_path: Path) -> None:
    with fake_slack() as fake:
        env = _clean_env(tmp_path, SLACK_BOT_TOKEN="xoxb-not-the-right-one", SLACK_APP_TOKEN=APP_TOKEN,
                         KERNELBOT_SLACK_API_URL=fake.base_url)
        proc = _doctor(env, "--json", "--skip-compile")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["slack"]["status"] == "fail" and "invalid_auth" in checks["slack"]["detail"]
    assert "xoxb-not-the-right-one" not in proc.stdout  # the token itself is never printed
    assert "OAuth & Permissions" in checks["slack"]["fix"] and "SLACK_BOT_TOKEN" in checks["slack"]["fix"]
    assert checks["compile"]["status"] == "skip" and checks["database"]["status"] == "ok"


# -- rendering and the exit code (pure) ------------------------------------------------------------------------------

def test_render_shows_a_fix_only_under_problems_and_the_exit_code_counts_needed_failures() -> None:
    checks = [Check("python", "ok", "3.13.0", "unused fix"), Check("hardware", "warn", "CPU only", "run a runner",
                                                                    needed=False),
              Check("slack", "skip", "not configured", "set it"), Check("database", "fail", "unreachable", "check URL")]
    text = render_checks(checks)
    assert "unused fix" not in text and "set it" not in text
    assert "fix: run a runner" in text and "fix: check URL" in text
    assert [m[1] for m in map(LINE.match, text.splitlines()) if m] == ["ok", "warn", "skip", "FAIL"]
    assert exit_code(checks) == 1 and exit_code(checks[:3]) == 0
    assert exit_code([Check("extra", "fail", "optional", needed=False)]) == 0
    assert text.splitlines()[-1] == "1 ok, 1 warning, 1 failed, 1 skipped: not ready: database failed"
    assert json.loads(json.dumps(as_json(checks)))["checks"][3] == {
        "name": "database", "status": "fail", "detail": "unreachable", "fix": "check URL", "needed": True,
        "blocking": True}


def test_an_old_python_fails_with_the_version_needed() -> None:
    check = check_python((3, 10, 9), "/usr/bin/python3")
    assert check.status == "fail" and "3.10.9" in check.detail and "3.11" in check.detail
    assert "KERNELBOT_PYTHON" in check.fix
    assert check_python().status == "ok"


def test_libtpu_is_checked_against_the_version_jax_pins() -> None:
    pattern = libtpu_requirement(metadata.requires("jax") or [])
    assert pattern is not None and version_matches(metadata.version("libtpu"), pattern)
    assert version_matches("0.0.50.1", "0.0.50.*") and not version_matches("0.0.51", "0.0.50.*")
    assert not version_matches("0.0.500", "0.0.50.*") and version_matches("1.2", "1.2")
    assert libtpu_requirement(['libtpu==0.0.50.*; extra == "other"']) is None
    assert check_libtpu().status == "ok"


def test_the_hardware_here_is_a_warning_that_never_fails_doctor(tmp_path: Path) -> None:
    check = check_hardware(_settings(tmp_path))
    assert check.status == "warn" and not check.needed and "estimated" in check.detail
    on_tpu = replace(_settings(tmp_path), host_target="v5e", default_target="v5e")
    assert check_hardware(on_tpu).status == "ok" and "TPU v5 lite" in check_hardware(on_tpu).detail
    off = check_hardware(replace(on_tpu, use_tpu=False))
    assert off.status == "warn" and "KERNELBOT_TPU=off" in off.detail


# -- settings ----------------------------------------------------------------------------------------------------

def test_settings_errors_name_the_variable_and_the_config_file_is_shown(tmp_path: Path) -> None:
    bad, settings = check_settings(lambda: _settings(tmp_path, KERNELBOT_EVAL_WORKERS="many"))
    assert settings is None and bad.status == "fail" and "KERNELBOT_EVAL_WORKERS='many'" in bad.detail
    assert bad.fix.startswith("correct or unset KERNELBOT_EVAL_WORKERS")
    config = tmp_path / "kernelbot.toml"
    config.write_text('KERNELBOT_TARGET = "v5e"\n')
    good, settings = check_settings(lambda: _settings(tmp_path, KERNELBOT_CONFIG=str(config)))
    assert good.status == "ok" and settings is not None and f"from {config}" in good.detail
    assert "target v5e" in good.detail


# -- the compile ---------------------------------------------------------------------------------------------------

def test_a_compile_that_does_not_finish_in_time_is_stopped_and_reported() -> None:
    check = check_compile("v5e", timeout=0.05)
    assert check.status == "fail" and check.needed
    assert "v5e (v5e=1x1) compile did not finish within 0.05 s" in check.detail
    assert "compile_probe" in check.fix and "--compile-timeout" in check.fix


def test_a_broken_child_is_reported_with_its_error(tmp_path: Path) -> None:
    """A libtpu the child cannot load (TPU_LIBRARY_PATH to a file that is not a library) fails, not hangs."""
    bogus = tmp_path / "libtpu.so"
    bogus.write_text("not a shared object")
    check = check_compile("v6e", timeout=120, env={**os.environ, "TPU_LIBRARY_PATH": str(bogus)})
    assert check.status == "fail", check
    assert "v6e (v6e=1x1) compile" in check.detail and ("exited with status" in check.detail
                                                         or "killed by" in check.detail)
    assert str(bogus) in check.detail and "Error" in check.detail  # the child's own exception line
    assert "pip install --force-reinstall 'jax[tpu]==" in check.fix


# -- the database ------------------------------------------------------------------------------------------------

def test_a_fresh_sqlite_home_is_fine_and_doctor_creates_nothing(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    check = check_database(settings)
    assert check.status == "ok" and "not created yet" in check.detail and head_revision() in check.detail
    assert not settings.home.exists()


def test_a_sqlite_database_behind_the_head_upgrades_itself(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings.home.mkdir(parents=True)
    engine = make_engine(settings.database)
    upgrade(engine, "0001")
    engine.dispose()
    check = check_database(settings)
    assert check.status == "ok" and "at 0001" in check.detail
    assert f"upgrades itself to {head_revision()}" in check.detail


@pytest.fixture
def postgres_url(tmp_path: Path) -> Iterator[str]:
    yield from fresh_database_url("postgresql", tmp_path)


def test_a_postgresql_database_behind_the_head_fails_with_the_upgrade_command(tmp_path: Path,
                                                                             postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    upgrade(engine, "0001")
    settings = _settings(tmp_path, KERNELBOT_DATABASE_URL=postgres_url)
    behind = check_database(settings)
    assert behind.status == "fail" and behind.needed and "at 0001" in behind.detail
    assert "`kernelbot db upgrade`" in behind.fix
    upgrade(engine)
    engine.dispose()
    at_head = check_database(settings)
    assert at_head.status == "ok" and f"at the schema head {head_revision()}" in at_head.detail


def test_an_unreachable_database_fails_naming_the_variable(tmp_path: Path) -> None:
    check = check_database(_settings(tmp_path, KERNELBOT_DATABASE_URL="postgresql://kb:secret@127.0.0.1:9/kb"))
    assert check.status == "fail" and "cannot reach postgresql://kb:***@127.0.0.1:9/kb" in check.detail
    assert "secret" not in check.detail and "KERNELBOT_DATABASE_URL" in check.fix
    garbage = check_database(_settings(tmp_path, KERNELBOT_DATABASE_URL="kb:secret at the office"))
    assert garbage.status == "fail" and garbage.detail == "KERNELBOT_DATABASE_URL is not a database URL"
    no_driver = check_database(_settings(tmp_path, KERNELBOT_DATABASE_URL="mysql://kb@127.0.0.1/kb"))
    assert no_driver.status == "fail" and "cannot reach mysql://kb@127.0.0.1/kb" in no_driver.detail


def test_a_file_that_is_not_a_database_fails_naming_the_home(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings.home.mkdir(parents=True)
    (settings.home / "kernelbot.db").write_text("not sqlite " * 200)
    check = check_database(settings)
    assert check.status == "fail" and "not a database" in check.detail and str(settings.home) in check.fix


# -- Slack ---------------------------------------------------------------------------------------------------------

def _slack_settings(tmp_path: Path, fake: FakeSlack, **env: str) -> Settings:
    return _settings(tmp_path, KERNELBOT_SLACK_API_URL=fake.base_url, **env)


def test_valid_slack_tokens_pass_with_the_workspace_and_the_bot(tmp_path: Path) -> None:
    with fake_slack() as fake:
        fake.socket_url = "ws://127.0.0.1:9/link"
        checks = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                      SLACK_APP_TOKEN=APP_TOKEN)))
    assert [c.status for c in checks.values()] == ["ok", "ok", "ok"], checks
    assert "workspace test (T0001" in checks["slack"].detail and "bot @kernelbot (UBOT)" in checks["slack"].detail
    scopes = checks["slack scopes"].detail
    assert f"all {len(SLACK_SCOPES)} scopes" in scopes and "manifest.yaml" in scopes
    assert "Socket Mode" in checks["slack mode"].detail
    assert [method for method, _ in fake.calls] == ["auth.test", "apps.connections.open"]


def test_a_missing_scope_is_named(tmp_path: Path) -> None:
    with fake_slack() as fake:
        fake.scopes = tuple(s for s in SLACK_SCOPES if s != "usergroups:read")
        checks = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                      SLACK_SIGNING_SECRET=SIGNING_SECRET)))
    scopes = checks["slack scopes"]
    assert scopes.status == "fail" and scopes.needed and "lacks usergroups:read" in scopes.detail
    assert "add usergroups:read" in scopes.fix and "reinstall the app" in scopes.fix
    assert exit_code(list(checks.values())) == 1


def test_the_manifest_is_compared_with_the_scopes_the_bot_needs(tmp_path: Path) -> None:
    assert manifest_scopes(MANIFEST) is not None and set(SLACK_SCOPES) <= (manifest_scopes(MANIFEST) or set())
    short = tmp_path / "manifest.yaml"
    short.write_text("oauth_config:\n  scopes:\n    bot: [commands, chat:write]\n")
    check = check_slack_scopes(set(SLACK_SCOPES), manifest_scopes(short))
    assert check.status == "warn" and "does not declare files:write" in check.detail
    assert "bot/slack/manifest.yaml" in check.fix
    assert manifest_scopes(tmp_path / "missing.yaml") is None
    assert check_slack_scopes(set(SLACK_SCOPES), None).status == "ok"


def test_without_the_scopes_header_the_scopes_are_a_warning(tmp_path: Path) -> None:
    """A token whose auth.test sends no x-oauth-scopes: doctor says it could not check them."""
    with fake_slack() as fake:
        fake.scopes = None
        checks = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                      SLACK_SIGNING_SECRET=SIGNING_SECRET)))
    assert checks["slack"].status == "ok"
    assert checks["slack scopes"].status == "warn" and "x-oauth-scopes" in checks["slack scopes"].detail


def test_a_wrong_slack_token_fails_with_a_fix(tmp_path: Path) -> None:
    with fake_slack() as fake:
        wrong = check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN="xoxb-wrong", SLACK_APP_TOKEN=APP_TOKEN))
        not_a_bot_token = check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=APP_TOKEN))
    (check,) = wrong
    assert check.status == "fail" and "refuses SLACK_BOT_TOKEN" in check.detail and "invalid_auth" in check.detail
    assert "xoxb-wrong" not in check.detail and "SLACK_BOT_TOKEN" in check.fix
    (shape,) = not_a_bot_token
    assert shape.status == "fail" and "not 'xoxb-'" in shape.detail


def test_socket_mode_needs_an_app_token_slack_accepts(tmp_path: Path) -> None:
    with fake_slack() as fake:
        fake.socket_url = "ws://127.0.0.1:9/link"
        wrong = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                     SLACK_APP_TOKEN="xapp-wrong")))["slack mode"]
        shape = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                     SLACK_APP_TOKEN=BOT_TOKEN)))["slack mode"]
        fake.socket_url = ""
        off = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                   SLACK_APP_TOKEN=APP_TOKEN)))["slack mode"]
        neither = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN)))["slack mode"]
    assert wrong.status == "fail" and "invalid_auth" in wrong.detail and "connections:write" in wrong.fix
    assert shape.status == "fail" and "not 'xapp-'" in shape.detail
    assert off.status == "fail" and "socket_mode_not_enabled" in off.detail and "--http" in off.fix
    assert neither.status == "fail" and "SLACK_APP_TOKEN" in neither.fix and "SLACK_SIGNING_SECRET" in neither.fix


def test_http_mode_checks_the_signing_secret_instead(tmp_path: Path) -> None:
    with fake_slack() as fake:
        good = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                    SLACK_SIGNING_SECRET=SIGNING_SECRET)))["slack mode"]
        short = _by_name(check_slack(_slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                     SLACK_SIGNING_SECRET="abc")))["slack mode"]
    assert good.status == "ok" and "HTTP mode" in good.detail
    assert "apps.connections.open" not in [method for method, _ in fake.calls]
    assert short.status == "warn" and "3 characters" in short.detail and "Signing Secret" in short.fix


def test_slack_is_skipped_unless_configured(tmp_path: Path) -> None:
    (skipped,) = check_slack(_settings(tmp_path))
    assert skipped.status == "skip" and exit_code([skipped]) == 0
    (half,) = check_slack(_settings(tmp_path, SLACK_APP_TOKEN=APP_TOKEN))
    assert half.status == "fail" and "SLACK_APP_TOKEN set but SLACK_BOT_TOKEN is not" in half.detail


# -- Anthropic -----------------------------------------------------------------------------------------------------

@pytest.fixture
def anthropic_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with fake_anthropic() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        yield fake.base_url


def test_a_valid_key_lists_the_models_and_the_default_is_the_newest_active_opus(tmp_path: Path,
                                                                                anthropic_url: str) -> None:
    key, model = check_anthropic(_settings(tmp_path, ANTHROPIC_API_KEY=API_KEY))
    newest = max((m for m in MODELS if m["line"] == "opus" and m["lifecycle"] == "active"),
                 key=lambda m: m["created_at"])["id"]
    assert key.status == "ok" and f"lists {len(MODELS)} models" in key.detail and anthropic_url in key.detail
    assert model.status == "ok" and model.detail.startswith(f"{newest} (the newest active Opus listed)")
    (pinned,) = check_anthropic(_settings(tmp_path, ANTHROPIC_API_KEY=API_KEY, KERNELBOT_MODEL="claude-sonnet-5-5"))[1:]
    assert pinned.status == "ok" and "KERNELBOT_MODEL='claude-sonnet-5-5'" in pinned.detail


def test_a_wrong_anthropic_key_fails(tmp_path: Path, anthropic_url: str) -> None:
    (check,) = check_anthropic(_settings(tmp_path, ANTHROPIC_API_KEY="sk-not-the-key"))
    assert check.status == "fail" and check.needed and "401" in check.detail
    assert "sk-not-the-key" not in check.detail and "ANTHROPIC_API_KEY" in check.fix


def test_an_unknown_or_deprecated_model_is_named(tmp_path: Path, anthropic_url: str) -> None:
    unknown = check_anthropic(_settings(tmp_path, ANTHROPIC_API_KEY=API_KEY, KERNELBOT_MODEL="claude-opus-9"))[1]
    assert unknown.status == "fail" and "KERNELBOT_MODEL='claude-opus-9' is not among" in unknown.detail
    active = [m["id"] for m in MODELS if m["lifecycle"] == "active"]
    assert all(model_id in unknown.fix for model_id in active)
    deprecated_id = next(m["id"] for m in MODELS if m["lifecycle"] == "deprecated")
    deprecated = check_anthropic(_settings(tmp_path, ANTHROPIC_API_KEY=API_KEY, KERNELBOT_MODEL=deprecated_id))[1]
    assert deprecated.status == "warn" and "deprecated" in deprecated.detail and deprecated_id not in deprecated.fix


def test_anthropic_is_skipped_without_a_key(tmp_path: Path) -> None:
    (check,) = check_anthropic(_settings(tmp_path))
    assert check.status == "skip" and "offline brain" in check.detail


# -- all together, in process --------------------------------------------------------------------------------------

def test_run_checks_with_every_service_configured(tmp_path: Path, anthropic_url: str) -> None:
    with fake_slack() as fake:
        fake.socket_url = "ws://127.0.0.1:9/link"
        checks = run_checks(lambda: _slack_settings(tmp_path, fake, SLACK_BOT_TOKEN=BOT_TOKEN,
                                                    SLACK_APP_TOKEN=APP_TOKEN, ANTHROPIC_API_KEY=API_KEY),
                            skip_compile=True)
    statuses = {c.name: c.status for c in checks}
    assert statuses == {"python": "ok", "kernelbot": "ok", "jax": "ok", "libtpu": "ok", "settings": "ok",
                        "hardware": "warn", "database": "ok", "compile": "skip", "slack": "ok", "slack scopes": "ok",
                        "slack mode": "ok", "anthropic": "ok", "anthropic model": "ok"}
    assert exit_code(checks) == 0
