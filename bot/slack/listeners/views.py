"""Modal submissions: a redirect's instructions, checked before the modal closes (errors shown in it)."""

from __future__ import annotations

from functools import partial
from typing import Any

from slack_bolt import Ack, App

from bot.slack.decisions import apply_decision
from bot.slack.listener_context import BotContext
from bot.slack.views.redirect_modal import REDIRECT_BLOCK, REDIRECT_CALLBACK, redirect_submission


def register(app: App, ctx: BotContext) -> None:
    app.view(REDIRECT_CALLBACK)(partial(handle_redirect_submission, ctx))


def handle_redirect_submission(ctx: BotContext, ack: Ack, body: dict[str, Any], view: dict[str, Any]) -> None:
    session_id, step, _, text = redirect_submission(view)
    if not text:
        ack(response_action="errors", errors={REDIRECT_BLOCK: "Say what the agent should do instead."})
        return
    user = str((body.get("user") or {}).get("id", ""))
    problem = apply_decision(ctx, session_id=session_id, step=step, action="redirect", user=user, text=text,
                             via="modal")
    if problem:
        ack(response_action="errors", errors={REDIRECT_BLOCK: problem[:2000]})
        return
    ack()
