"""Buttons on session messages: each click is acked, checked (who may steer, which step it answers) and
recorded as a decision; anyone whose click changed nothing is told why, ephemerally."""

from __future__ import annotations

from functools import partial
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient

from bot.slack.decisions import apply_decision
from bot.slack.listener_context import BotContext
from bot.slack.views.redirect_modal import redirect_modal
from bot.slack.views.session import button_value

DECISIONS = ("approve", "handoff", "cancel", "iterate", "finish", "adopt", "search", "handback")


def _where(body: dict[str, Any]) -> tuple[str, str]:
    channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id") or ""
    return str((body.get("user") or {}).get("id", "")), str(channel)


def _tell(client: WebClient, *, channel: str, user: str, text: str) -> None:
    if channel:
        client.chat_postEphemeral(channel=channel, user=user, text=text)


def register(app: App, ctx: BotContext) -> None:
    for action_id in DECISIONS:
        app.action(action_id)(partial(handle_decision_button, ctx))
    app.action("redirect")(partial(handle_redirect_button, ctx))


def handle_decision_button(ctx: BotContext, ack: Ack, body: dict[str, Any], action: dict[str, Any],
                           client: WebClient) -> None:
    ack()
    user, channel = _where(body)
    try:
        session_id, step = button_value(action.get("value", ""))
    except ValueError as exc:
        _tell(client, channel=channel, user=user, text=str(exc))
        return
    problem = apply_decision(ctx, session_id=session_id, step=step, action=action["action_id"], user=user,
                             via="button")
    if problem:
        _tell(client, channel=channel, user=user, text=problem)


def handle_redirect_button(ctx: BotContext, ack: Ack, body: dict[str, Any], action: dict[str, Any],
                           client: WebClient) -> None:
    ack()
    user, channel = _where(body)
    session_id, step = button_value(action.get("value", ""))
    try:
        allowed, why = ctx.may_steer_session(user=user, session_id=session_id)
    except LookupError:
        _tell(client, channel=channel, user=user, text=f"Session `{session_id}` no longer exists.")
        return
    if not allowed:
        _tell(client, channel=channel, user=user, text=why)
        return
    client.views_open(trigger_id=body.get("trigger_id", ""),
                      view=redirect_modal(session_id=session_id, step=step, channel=channel))
