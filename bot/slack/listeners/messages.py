"""Thread replies: a reply in a session's thread from someone allowed to steer, while the session waits for a
person, is a redirect. Slack retries event deliveries, so each message is handled once (`slack_inbox`)."""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt import App
from slack_sdk import WebClient

from bot.slack.decisions import apply_decision, session_in_thread
from bot.slack.listener_context import BotContext

log = logging.getLogger("kernelbot.slack")


def register(app: App, ctx: BotContext) -> None:
    @app.event("message")
    def handle_thread_reply(event: dict[str, Any], body: dict[str, Any], client: WebClient) -> None:
        thread_ts, ts = event.get("thread_ts"), event.get("ts")
        if event.get("subtype") or event.get("bot_id") or not thread_ts or thread_ts == ts:
            return  # edits, joins, the bot's own posts and top-level messages are not replies to a session
        channel, user, text = str(event.get("channel", "")), str(event.get("user", "")), str(event.get("text", ""))
        record = session_in_thread(ctx, channel=channel, thread_ts=str(thread_ts))
        if record is None or not text.strip():
            return
        allowed, _ = ctx.may_steer(user=user, owner=record.owner)
        if not allowed:
            return  # teammates talking in the thread; only people who may steer are heard
        if not ctx.first_delivery(f"message:{channel}:{ts}"):
            return
        problem = apply_decision(ctx, session_id=record.id, step=None, action="redirect", user=user, text=text,
                                 via="thread")
        if problem:
            client.chat_postEphemeral(channel=channel, user=user, thread_ts=str(thread_ts),
                                      text="Your reply was not taken as a redirect: " + problem)
