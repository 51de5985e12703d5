"""`kernelbot doctor`'s checks, all of them in order."""

from __future__ import annotations

from collections.abc import Callable

from bot.cli.checks.anthropic import check_anthropic
from bot.cli.checks.chip import check_chip
from bot.cli.checks.compile import COMPILE_TIMEOUT_S, check_compile
from bot.cli.checks.database import check_database
from bot.cli.checks.install import (
    check_hardware,
    check_jax,
    check_kernelbot,
    check_libtpu,
    check_python,
    check_settings,
)
from bot.cli.checks.report import Check
from bot.cli.checks.slack import check_slack
from storage.settings import Settings
from tpu_runner.hardware import get_chip


def run_checks(load: Callable[[], Settings], *, skip_compile: bool = False,
               compile_timeout: float = COMPILE_TIMEOUT_S) -> list[Check]:
    checks = [check_python(), check_kernelbot(), check_jax(), check_libtpu()]
    settings_check, settings = check_settings(load)
    checks += [settings_check, check_hardware(settings)]
    if settings is None:
        return checks + [Check(name, "skip", "not checked: the settings did not load")
                         for name in ("database", "compile", "slack", "anthropic")]
    if settings.host_target and settings.use_tpu:
        checks.append(check_chip(get_chip(settings.host_target)))
    checks.append(check_database(settings))
    if skip_compile:
        checks.append(Check("compile", "skip", f"skipped (--skip-compile); the {settings.default_target} compile "
                            "is not checked"))
    elif any(c.blocking for c in checks if c.name in ("jax", "libtpu")):
        checks.append(Check("compile", "fail", "not tried: jax or libtpu is missing (above)",
                            "fix jax and libtpu first"))
    else:
        checks.append(check_compile(settings.default_target, timeout=compile_timeout))
    return checks + check_slack(settings) + check_anthropic(settings)
