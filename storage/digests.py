"""What a digest of a period reads, the digest runs kept for the notifier to post, and where digests go (the
channels' subscriptions over the settings' default list). Functions take the caller's session and never commit;
a period is [since, until) in UNIX seconds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from storage.models import DigestRun, DigestSubscription, Evaluation, Job, KernelSession, SessionEvent, now


def get_best_evaluations(session: Session, *, since: float, until: float) -> list[tuple[KernelSession, Evaluation]]:
    """(session, evaluation of its best candidate) for each evaluation of a session's best kernel in the period."""
    return list(session.exec(select(KernelSession, Evaluation)
                             .join(Evaluation, col(Evaluation.candidate_id) == col(KernelSession.best_candidate_id))
                             .where(col(Evaluation.created_at) >= since, col(Evaluation.created_at) < until)).all())


def get_finished_searches(session: Session, *, since: float, until: float
                          ) -> list[tuple[SessionEvent, KernelSession]]:
    """(its `search_finished` event, the session) for each search that finished in the period, oldest first."""
    return list(session.exec(select(SessionEvent, KernelSession)
                             .join(KernelSession, col(KernelSession.id) == col(SessionEvent.session_id))
                             .where(SessionEvent.kind == "search_finished", col(SessionEvent.created_at) >= since,
                                    col(SessionEvent.created_at) < until)
                             .order_by(col(SessionEvent.id))).all())


def get_failed_jobs(session: Session, *, since: float, until: float) -> list[tuple[Job, str | None]]:
    """(job, its session's channel) for each job that failed for good in the period, newest first (the channel is
    None for a job of no session, or of a session started from a terminal)."""
    return [(job, channel) for job, channel in session.exec(
        select(Job, KernelSession.slack_channel)
        .outerjoin(KernelSession, col(KernelSession.id) == col(Job.session_id))
        .where(Job.status == "failed", col(Job.finished_at) >= since, col(Job.finished_at) < until)
        .order_by(col(Job.finished_at).desc())).all()]


def get_failed_sessions(session: Session, *, since: float, until: float) -> list[KernelSession]:
    """Sessions that failed in the period (their last change), oldest first."""
    return list(session.exec(select(KernelSession).where(KernelSession.status == "failed",
                                                         col(KernelSession.updated_at) >= since,
                                                         col(KernelSession.updated_at) < until)
                             .order_by(col(KernelSession.updated_at))).all())


def add_digest_run(session: Session, *, channel: str, period: str, payload: dict[str, Any]) -> DigestRun:
    """Keep a digest as pending for the notifier; (channel, period) is unique, so a second one fails on flush."""
    run = DigestRun(channel=channel, period=period, payload=payload)
    session.add(run)
    session.flush()
    return run


def get_recent_digest_runs(session: Session, *, channel: str, excluding_prefix: str, limit: int = 20
                           ) -> list[DigestRun]:
    """The channel's latest digest runs, newest first, without those whose period starts with `excluding_prefix`."""
    return list(session.exec(select(DigestRun).where(DigestRun.channel == channel,
                                                     col(DigestRun.period).not_like(f"{excluding_prefix}%"))
                             .order_by(col(DigestRun.id).desc()).limit(limit)).all())


def get_digest_subscriptions(session: Session) -> list[DigestSubscription]:
    """Every channel's recorded choice, subscribed or not, oldest change first."""
    return list(session.exec(select(DigestSubscription).order_by(col(DigestSubscription.changed_at))).all())


def get_digest_subscription(session: Session, *, channel: str) -> DigestSubscription | None:
    return session.get(DigestSubscription, channel)


def get_digest_channels(session: Session, *, defaults: Sequence[str]) -> list[str]:
    """Where digests go: the default channels (the settings' list) that did not unsubscribe, then the channels
    that subscribed, each once."""
    choices = {row.channel: row.subscribed for row in get_digest_subscriptions(session)}
    listed = [c for c in dict.fromkeys(defaults) if choices.get(c, True)]
    return listed + [c for c, subscribed in choices.items() if subscribed and c not in listed]


def set_digest_subscription(session: Session, *, channel: str, subscribed: bool, user: str | None
                            ) -> DigestSubscription:
    """Record that `user` subscribed this channel to the digest (or unsubscribed it), replacing its last choice."""
    row = session.get(DigestSubscription, channel)
    if row is None:
        try:
            with session.begin_nested():  # someone may record this channel's first choice at the same moment
                row = DigestSubscription(channel=channel, subscribed=subscribed, changed_by=user, changed_at=now())
                session.add(row)
                session.flush()
            return row
        except IntegrityError:
            row = session.get(DigestSubscription, channel, populate_existing=True)
            if row is None:
                raise
    row.subscribed, row.changed_by, row.changed_at = subscribed, user, now()
    session.add(row)
    session.flush()
    return row
