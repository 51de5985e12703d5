"""The App Home tab, published each time someone opens it, with the sessions this person may see; and the clicks
of its link buttons, which Slack sends although the button only opens a URL (acked, nothing to do)."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient
from sqlmodel import Session

from agents.auto_decide import StepRecord
from agents.hitl import waiting_for
from bot.slack.listener_context import BotContext
from bot.slack.views.home import OPEN_THREAD, OPEN_WAITING, HomeSession, build_home
from bot.slack.visibility import audience
from bot.speedup import evaluation_speedup
from storage import sessions
from storage.models import KernelSession

RECENT = 15
LOOKED_AT = 200  # the newest sessions the Home picks its recent ones from: some may be hidden from this person
LINK_BUTTONS = re.compile(f"^({OPEN_THREAD}|{OPEN_WAITING}):")


def home_sessions(ctx: BotContext, user: str) -> tuple[list[HomeSession], list[HomeSession]]:
    """(recent sessions, sessions waiting for a decision this person may take), of those this person may see."""
    shown = audience(ctx.visibility, viewer=user)
    with Session(ctx.engine) as s:
        rows = [r for r in sessions.get_sessions(s, limit=LOOKED_AT) if shown(r.slack_channel)][:RECENT]
        awaiting = sessions.get_awaiting_sessions(s, mode="hitl", limit=50)
        best_ids = [r.best_candidate_id for r in rows if r.best_candidate_id]
        best = {e.candidate_id: e for e in sessions.get_evaluations(s, candidate_ids=best_ids)}

        def item(r: KernelSession, waiting: str | None = None) -> HomeSession:
            e = best.get(r.best_candidate_id)
            return HomeSession(r.id, r.mode, r.task, r.target, r.status, r.owner, r.slack_channel, r.slack_thread_ts,
                               waiting, evaluation_speedup(e))

        pending = []
        for r in awaiting:
            if not ctx.may_steer(user=user, owner=r.owner)[0] or not shown(r.slack_channel):
                continue
            steps = [StepRecord(st.kind, dict(st.outputs or {})) for st in sessions.get_steps(s, session_id=r.id)]
            waits = waiting_for(steps)
            if waits:
                pending.append(item(r, waits))
        return [item(r) for r in rows], pending


def register(app: App, ctx: BotContext) -> None:
    app.event("app_home_opened")(partial(handle_home_opened, ctx))
    app.action(LINK_BUTTONS)(handle_link_button)


def handle_home_opened(ctx: BotContext, event: dict[str, Any], client: WebClient) -> None:
    if event.get("tab", "home") != "home":
        return
    user = str(event.get("user", ""))
    recent, pending = home_sessions(ctx, user)
    client.views_publish(user_id=user, view=build_home(user=user, recent=recent, pending=pending))


def handle_link_button(ack: Ack) -> None:
    ack()
