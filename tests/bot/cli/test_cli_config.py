"""`kernelbot config`: every setting with its value in force and where it came from; secrets masked; a wrong value
stops with a line naming the setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from storage.settings import VARIABLES

KERNELBOT = str(Path(sys.executable).parent / "kernelbot")


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELBOT_", "SLACK_", "ANTHROPIC_"))}
    return subprocess.run([KERNELBOT, "config", *args], env={**clean, "KERNELBOT_HOME": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=60)


def test_values_come_from_the_environment_the_file_or_the_defaults(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('KERNELBOT_TARGET = "v5e"\nSLACK_BOT_TOKEN = "xoxb-1234567890-secret"\n')
    proc = _run(tmp_path, "--json", KERNELBOT_CONFIG=str(config), KERNELBOT_EVAL_WORKERS="4")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == {v.name for v in VARIABLES}
    assert rows["KERNELBOT_TARGET"] == {"name": "KERNELBOT_TARGET", "value": "v5e", "source": str(config),
                                        "choices": ["v5e", "v6e", "v5p"]}
    assert rows["KERNELBOT_EVAL_WORKERS"]["value"] == "4" and rows["KERNELBOT_EVAL_WORKERS"]["source"] == "environment"
    assert rows["SLACK_BOT_TOKEN"]["value"] == "xoxb… (set)" and "secret" not in proc.stdout
    # A default is shown as the value in force, so a script can read it.
    assert rows["KERNELBOT_TIMEZONE"]["source"] == "default: `UTC`" and rows["KERNELBOT_TIMEZONE"]["value"] == "UTC"
    assert rows["KERNELBOT_EVAL_TIMEOUT"]["value"] == "300" and rows["KERNELBOT_TPU"]["value"] == "auto"
    assert rows["KERNELBOT_DATABASE_URL"]["value"] == f"sqlite:///{tmp_path / 'kernelbot.db'}"
    assert all(r["value"] for r in rows.values() if r["name"].startswith("KERNELBOT_") and
               r["name"] not in ("KERNELBOT_DEBUG", "KERNELBOT_PYTHON", "KERNELBOT_HOST_JAX"))


def test_a_password_in_the_database_url_is_not_shown_and_a_closed_pipe_is_no_error(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--json", KERNELBOT_DATABASE_URL="postgresql://kb:hunter2@db.example/kernelbot")
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["KERNELBOT_DATABASE_URL"]["value"] == "postgresql://kb:***@db.example/kernelbot"
    assert "hunter2" not in proc.stdout
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELBOT_", "SLACK_", "ANTHROPIC_"))}
    piped = subprocess.run(f"'{KERNELBOT}' config --json | head -1", shell=True, capture_output=True, text=True,
                           env={**clean, "KERNELBOT_HOME": str(tmp_path)}, timeout=60)
    assert piped.stdout == "[\n" and "error" not in piped.stderr, piped.stderr


def test_a_wrong_value_names_the_setting(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--check", KERNELBOT_EVAL_WORKERS="many")
    assert proc.returncode == 2 and "KERNELBOT_EVAL_WORKERS='many' is not a whole number" in proc.stderr
    proc = _run(tmp_path, "--check", KERNELBOT_TPU="sometimes")
    assert proc.returncode == 2 and "KERNELBOT_TPU='sometimes' must be one of auto, off" in proc.stderr
    assert _run(tmp_path, "--check").returncode == 0
