"""What a digest of a period reads, and the digest runs kept for the notifier to post. Functions take the caller's
session and never commit; a period is [since, until) in UNIX seconds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from storage.models import DigestRun, Evaluation, Job, KernelSession, SessionEvent


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


def get_failed_jobs(session: Session, *, since: float, until: float, limit: int) -> tuple[int, list[Job]]:
    """(how many jobs failed for good in the period, the latest `limit` of them, newest first)."""
    period = (Job.status == "failed", col(Job.finished_at) >= since, col(Job.finished_at) < until)
    count = int(session.exec(select(func.count()).select_from(Job).where(*period)).one())
    rows = session.exec(select(Job).where(*period).order_by(col(Job.finished_at).desc()).limit(limit)).all()
    return count, list(rows)


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
