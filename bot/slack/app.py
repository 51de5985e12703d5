"""The Slack app: the real Bolt app with kernelbot's listeners. Built by `kernelbot serve` (and the tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from slack_bolt import App
from slack_sdk import WebClient
from slack_sdk.http_retry import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from sqlalchemy import Engine

from bot.slack import listeners
from bot.slack.channel_access import ChannelAccess
from bot.slack.lanes import Lanes
from bot.slack.listener_context import BotContext, GroupDirectory
from bot.slack.steering import SteeringPolicy
from bot.slack.visibility import ChannelDirectory
from storage.errors import KernelbotError
from storage.settings import Settings

RATE_LIMIT_RETRIES = 2  # 429s a listener's call waits out before it gives up
LISTENER_THREADS = 16  # the listeners' main lane (acks, clicks, events); slow work has lanes of its own


class SlackSettingsError(KernelbotError, ValueError):
    """What `serve` needs from the environment and did not get."""
    next_step = ("set or fix what the message names (in the environment, or on the Slack app's settings pages), "
                 "then start `kernelbot serve` again")


def web_client(settings: Settings, **kwargs: object) -> WebClient:
    """The bot's Web API client. The listeners' calls (views, ephemeral answers, user groups, conversations) wait
    out a 429's Retry-After and retry a dropped connection; a caller that paces itself passes its own
    `retry_handlers` (the notifier passes none: it pauses the channel on a 429 instead of sleeping in the call)."""
    if not settings.slack_bot_token:
        raise SlackSettingsError("SLACK_BOT_TOKEN is not set: the bot token (xoxb-...) from the app's OAuth page")
    options: dict[str, object] = {"retry_handlers": [ConnectionErrorRetryHandler(max_retry_count=1),
                                                     RateLimitErrorRetryHandler(max_retry_count=RATE_LIMIT_RETRIES)]}
    if settings.slack_api_url:
        options["base_url"] = settings.slack_api_url
    return WebClient(token=settings.slack_bot_token, **{**options, **kwargs})  # type: ignore[arg-type]


def notifier_client(settings: Settings) -> WebClient:
    """The notifier's client: no retries inside a call. The notifier paces each channel and, on a 429, pauses
    that channel for Slack's Retry-After itself; a retry sleeping inside the call would hold every channel."""
    return web_client(settings, retry_handlers=[])


def app_token(settings: Settings) -> str:
    """The app-level token Socket Mode connects with."""
    token = settings.slack_app_token or ""
    if not token.startswith("xapp-"):
        raise SlackSettingsError("SLACK_APP_TOKEN is not set to an app-level token (xapp-...): Socket Mode needs one "
                                 "with connections:write (the app's Basic Information page), or use --http")
    return token


def build_context(settings: Settings, engine: Engine, client: WebClient, *, suites: list[Path] | None = None,
                  notify: Callable[[], None] | None = None) -> BotContext:
    try:
        policy = SteeringPolicy.parse(settings.steerers)
    except ValueError as exc:
        raise SlackSettingsError(str(exc)) from None
    configured = [*settings.suites, *(suites or [])]
    missing = [str(p) for p in configured if not Path(p).is_dir()]
    if missing:
        raise SlackSettingsError(f"task suite directories do not exist: {', '.join(missing)} (--suite or "
                                 "KERNELBOT_SUITES)")
    # Tasks pasted into the `/kernel new` form live in the data directory and are tasks like any other.
    return BotContext(settings=settings, engine=engine, suites=[*configured, settings.home / "tasks"],
                      policy=policy,
                      groups=GroupDirectory(client), channels=ChannelAccess(client),
                      visibility=ChannelDirectory(client), notify=notify or (lambda: None))


def build_app(settings: Settings, engine: Engine, *, suites: list[Path] | None = None, socket_mode: bool = False,
              notify: Callable[[], None] | None = None) -> App:
    client = web_client(settings)
    if socket_mode:
        app_token(settings)
    if not socket_mode and not settings.slack_signing_secret:
        raise SlackSettingsError("SLACK_SIGNING_SECRET is not set: HTTP mode verifies every request with it")
    # Clicks and thread replies record their decisions on the main lane's threads; Bolt's default five would let a
    # few of them waiting on a locked database hold up every other listener's ack behind them. Slow work (lazy
    # listeners: `/kernel` answers, checks, ports) runs in lanes of its own and never holds an ack up either.
    # process_before_response stays False: Slack gets the ack as soon as the ack function calls ack(), while the
    # rest of it and its lazy functions (started alongside it) go on; True would hold the ack until it returned.
    app = App(client=client, signing_secret=settings.slack_signing_secret or "unused-in-socket-mode",
              token_verification_enabled=False, process_before_response=False,
              listener_executor=Lanes(main_workers=LISTENER_THREADS))
    listeners.register(app, build_context(settings, engine, client, suites=suites, notify=notify))
    return app
