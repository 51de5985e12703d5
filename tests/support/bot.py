"""The bot as the tests (and the documentation's pictures) meet it: the real Bolt app behind kernelbot's HTTP
server against the fake Slack, or the whole `serve` (notifier, leader, an embedded runner)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bot.slack.app import build_app
from bot.slack.server import ServeOptions, Server
from storage.connect import open_database
from storage.settings import Settings, load_settings
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, fake_slack
from tests.support.slack_http import SECRET, free_port, served, wait_for_port


def bot_settings(home: Path, fake: FakeSlack, **env: str) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(home), "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET,
                          "KERNELBOT_SLACK_API_URL": fake.base_url, **env})


@dataclass
class Served:
    url: str  # /slack/events
    fake: FakeSlack
    settings: Settings


@contextmanager
def bot_app(home: Path, **env: str) -> Iterator[Served]:
    """The Bolt app alone (no notifier, no runner), answering signed requests."""
    with fake_slack() as fake:
        settings = bot_settings(home, fake, **env)
        with served(build_app(settings, open_database(settings))) as url:
            yield Served(url, fake, settings)


@contextmanager
def whole_server(home: Path, **env: str) -> Iterator[tuple[str, FakeSlack, Server]]:
    """`kernelbot serve --http --with-runner` in this process: the app, the notifier and a runner."""
    with fake_slack() as fake:
        settings = bot_settings(home, fake, **{"KERNELBOT_EVAL_WORKERS": "1", **env})
        port = free_port()
        server = Server(settings, open_database(settings), ServeOptions(http=True, host="127.0.0.1", port=port,
                                                                        with_runner=True))
        server.start()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        wait_for_port(port)
        try:
            yield f"http://127.0.0.1:{port}/slack/events", fake, server
        finally:
            server.shutdown(grace_seconds=10)
