"""Thread replies: a reply in a session's thread that is addressed to the bot (it mentions the bot or starts with
`redirect:`), from someone allowed to steer, while the session waits for a person, is a redirect; whoever
addressed it is told when it was not taken. Every other reply is people talking and is left alone. Slack
retries event deliveries, so each message is handled once (`slack_inbox`)."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from slack_bolt import App, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from bot.slack.decisions import apply_decision, session_in_thread
from bot.slack.listener_context import BotContext
from bot.slack.thread_replies import addressed_text

log = logging.getLogger("kernelbot.slack")


def register(app: App, ctx: BotContext) -> None:
    app.event("message")(partial(handle_thread_reply, ctx))


def handle_thread_reply(ctx: BotContext, event: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    thread_ts, ts = event.get("thread_ts"), event.get("ts")
    if event.get("subtype") or event.get("bot_id") or not thread_ts or thread_ts == ts:
        return  # edits, joins, the bot's own posts and top-level messages are not replies to a session
    channel, user = str(event.get("channel", "")), str(event.get("user", ""))
    text = addressed_text(str(event.get("text", "")), bot_user=context.bot_user_id)
    if text is None:
        return  # conversation in the thread, not addressed to the bot
    record = session_in_thread(ctx, channel=channel, thread_ts=str(thread_ts))
    if record is None:
        return
    if not ctx.first_delivery(f"message:{channel}:{ts}"):
        return
    problem = apply_decision(ctx, session_id=record.id, step=None, action="redirect", user=user, text=text,
                             via="thread")  # who may steer is checked there, as for every surface
    if problem:
        try:
            client.chat_postEphemeral(channel=channel, user=user, thread_ts=str(thread_ts),
                                      text="Your reply was not taken as a redirect: " + problem)
        except (SlackApiError, SlackClientError, OSError):
            log.exception("cannot tell %s in %s why their reply was not taken as a redirect", user, channel)
