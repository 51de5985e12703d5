"""`kernelbot serve`: the Slack app. This version serves `/kernel` over HTTP (request signing); Socket Mode, the
notifier that posts session threads, and the scheduler come next."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bot.cli import console, get_settings, run_command

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


@_app.command("serve")
def serve_command(
    http: Annotated[bool, typer.Option("--http", help="Serve Slack's requests over HTTP at /slack/events "
                                       "(needs SLACK_SIGNING_SECRET).")] = False,
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 3000,
    suite: Annotated[list[Path] | None, typer.Option("--suite", help="Extra task suite directories "
                                                     "(tasks/ is always there).")] = None,
) -> None:
    """The Slack app: /kernel commands acked at once and recorded as sessions for the runners."""

    def run() -> int:
        from bot.slack_app import build_app
        from storage.database import open_database

        if not http:
            raise ValueError("this version serves Slack over HTTP only: use --http (Socket Mode comes next)")
        settings = get_settings()
        app = build_app(settings, open_database(settings), suites=list(suite or []))
        console.print(f"kernelbot: serving /kernel on http://0.0.0.0:{port}/slack/events")
        app.start(port=port, path="/slack/events")
        return 0

    run_command(run)
