"""A person's click, modal or thread reply turned into a recorded decision: who may steer is checked, the
decision is validated against the step it answers, the notifier is woken. Returns what the person should be
told when nothing happened (None when it was recorded). No Slack here: listeners call this."""

from __future__ import annotations

from sqlmodel import Session

from agents.commands import continue_with_search, decide
from agents.hitl import DecisionRejected
from bot.slack.listener_context import BotContext
from storage import sessions
from storage.models import KernelSession

LIVE = ("active", "awaiting", "done")  # a finished Auto session still takes adopt / search / handback


def apply_decision(ctx: BotContext, *, session_id: str, step: int | None, action: str, user: str,
                   text: str | None = None, via: str = "button") -> str | None:
    try:
        allowed, why = ctx.may_steer_session(user=user, session_id=session_id)
    except LookupError:
        return f"Session `{session_id}` no longer exists; nothing was changed."
    if not allowed:
        return why
    try:
        if action == "search":
            continue_with_search(ctx.engine, session_id=session_id, actor=user, step=step, via=via)
        else:
            decide(ctx.engine, session_id=session_id, actor=user, action=action, text=text, step=step, via=via)
    except DecisionRejected as exc:
        return f"{exc}. Nothing was changed."
    ctx.notify()
    return None


def session_in_thread(ctx: BotContext, *, channel: str, thread_ts: str) -> KernelSession | None:
    """The newest live session that lives in this thread (a search started from a session shares its thread)."""
    with Session(ctx.engine) as s:
        return sessions.get_session_in_thread(s, channel=channel, thread_ts=thread_ts, statuses=LIVE)
