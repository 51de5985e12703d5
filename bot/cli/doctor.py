"""`kernelbot doctor`: is this installation and configuration ready, and if not, what to fix."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bot.cli.checks.compile import COMPILE_TIMEOUT_S
from bot.cli.checks.report import as_json as checks_json
from bot.cli.checks.report import exit_code, render_checks
from bot.cli.checks.run import run_checks
from bot.cli.common import AsJson, console, get_settings, run_command

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


DOCTOR_HELP = (
    "Check the installation and configuration, and explain each problem with a fix.\n\n"
    "Checks: Python (>= 3.11); kernelbot, jax, jaxlib and libtpu (the one jax pins); that the settings load, and "
    "from which config file; the hardware (this host's TPU, which is then the default target, or CPU only: times "
    "are estimated); on a TPU host, the chip: opened, a small Pallas kernel run and timed on it (or who holds "
    "it); a tiny Pallas kernel compiled ahead of time with libtpu for KERNELBOT_TARGET (in a child process with "
    "a timeout); the database "
    "(reachable, schema at the head); Slack when SLACK_BOT_TOKEN is set (auth.test, the workspace and bot, the "
    "scopes, and Socket Mode's SLACK_APP_TOKEN or HTTP mode's SLACK_SIGNING_SECRET); Anthropic when "
    "ANTHROPIC_API_KEY is set (the key lists models; KERNELBOT_MODEL or the default is among them).\n\n"
    "Exits 1 when a needed check fails (warnings and skipped checks do not count), else 0."
)


@_app.command("doctor", help=DOCTOR_HELP)
def doctor_command(
    as_json: AsJson = False,
    skip_compile: Annotated[bool, typer.Option("--skip-compile", help="Do not compile the test kernel for the "
                                               "target (the compile takes a few seconds).")] = False,
    compile_timeout: Annotated[float, typer.Option("--compile-timeout", help="Seconds the test compile may take "
                                                   "before it is stopped and reported.", min=0.01)] = COMPILE_TIMEOUT_S,
) -> None:
    def run() -> int:
        checks = run_checks(get_settings, skip_compile=skip_compile, compile_timeout=compile_timeout)
        if as_json:
            print(json.dumps(checks_json(checks), indent=1))
        else:
            console.print(render_checks(checks), markup=False, highlight=False, soft_wrap=True)
        return exit_code(checks)

    run_command(run, as_json=as_json)


@_app.command("healthcheck", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def healthcheck_command(ctx: typer.Context) -> None:
    """The container health check: exit 0 when the process the command line starts is healthy (serve --http:
    /healthz; runner: database at the schema head and a recent heartbeat; serve: the database), else 1 with
    one line saying why. Without arguments it reads PID 1's command line (inside the image)."""
    from bot.cli.healthcheck import assess, pid1_command_line

    args = list(ctx.args) or pid1_command_line()
    healthy, why = assess(args, get_settings())
    print(("healthy: " if healthy else "unhealthy: ") + why)
    raise typer.Exit(0 if healthy else 1)
