"""Slack listeners, one module per surface; `register` maps Slack's ids to their handlers."""

from __future__ import annotations

from slack_bolt import App

from bot.slack.listener_context import BotContext
from bot.slack.listeners import actions, commands, home, messages, port, reference, views


def register(app: App, ctx: BotContext) -> None:
    commands.register(app, ctx)
    actions.register(app, ctx)
    views.register(app, ctx)
    messages.register(app, ctx)
    home.register(app, ctx)
    reference.register(app, ctx)
    port.register(app, ctx)
