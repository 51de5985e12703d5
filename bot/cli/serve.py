"""`kernelbot serve`: the Slack app (Socket Mode by default, HTTP when asked), the notifier and the scheduler,
and with `--with-runner` a runner in the same process."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bot.cli.common import console, get_settings, run_command

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy import Engine

    from storage.settings import Settings

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


@_app.command("serve")
def serve_command(
    http: Annotated[bool, typer.Option("--http", help="Serve Slack's requests over HTTP at /slack/events "
                                       "(needs SLACK_SIGNING_SECRET) instead of Socket Mode (SLACK_APP_TOKEN).")]
    = False,
    host: Annotated[str, typer.Option("--host", help="HTTP address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 3000,
    with_runner: Annotated[bool, typer.Option("--with-runner", help="Run a runner in this process too "
                                              "(a single-host team).")] = False,
    runner_concurrency: Annotated[int, typer.Option("--runner-concurrency", help="Jobs the embedded runner runs "
                                                    "at once.")] = 1,
    suite: Annotated[list[Path] | None, typer.Option("--suite", help="Extra task suite directories "
                                                     "(tasks/ is always there; also KERNELBOT_SUITES).")] = None,
) -> None:
    """The Slack app: /kernel commands, session threads with approvals, Auto results and digests."""

    def run() -> int:
        from bot.slack.server import ServeOptions, Server
        from storage.connect import open_database
        from storage.logs import configure_logging

        settings = get_settings()
        configure_logging(settings, default_level="info")
        options = ServeOptions(http=http, host=host, port=port, with_runner=with_runner,
                               runner_concurrency=runner_concurrency, suites=tuple(suite or ()))
        server = Server(settings, open_database(settings), options, leader_services=_leader_services())

        def stop(*_: Any) -> None:
            threading.Thread(target=server.shutdown, name="shutdown", daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        server.start()
        where = f"http://{host}:{port}/slack/events" if http else "Socket Mode"
        console.print(f"kernelbot: serving Slack on {where}" + (" with an embedded runner" if with_runner else ""))
        server.serve_forever()
        server.shutdown()
        return 0

    run_command(run)


def _leader_services() -> list[Any]:
    from bot.slack.app import web_client
    from bot.slack.scheduler import start_scheduler
    from bot.slack.visibility import ChannelDirectory

    def scheduler(settings: Settings, engine: Engine) -> Callable[[], None]:
        # Each digest shows public channels' sessions besides its own channel's: Slack says which are public.
        return start_scheduler(settings, engine, visibility=ChannelDirectory(web_client(settings)))

    return [scheduler]
