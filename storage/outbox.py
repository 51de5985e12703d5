"""The outbox a surface delivers from: session events not yet delivered there, with their delivery per surface;
digest runs waiting to be posted; and the messages posted, by scope and key, so nothing is posted twice.
Functions take the caller's session and never commit: a delivery's recording commits with what it records."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, func, or_
from sqlmodel import Session, col, select

from storage.models import DigestRun, EventDelivery, KernelSession, SessionEvent, SlackMessage, now


def get_undelivered_events(session: Session, *, surface: str, after_id: int, limit: int
                           ) -> list[tuple[SessionEvent, str]]:
    """(event, its session's channel) for events above `after_id` of sessions that live in a channel, not yet
    delivered to `surface` (no delivery row, or one still pending), oldest first."""
    delivery = and_(EventDelivery.event_id == SessionEvent.id, EventDelivery.surface == surface)
    rows = session.exec(
        select(SessionEvent, KernelSession.slack_channel)
        .join(KernelSession, col(KernelSession.id) == SessionEvent.session_id)
        .outerjoin(EventDelivery, delivery)
        .where(col(KernelSession.slack_channel).is_not(None), col(SessionEvent.id) > after_id,
               or_(col(EventDelivery.id).is_(None), EventDelivery.status == "pending"))
        .order_by(col(SessionEvent.id)).limit(limit)).all()
    return [(event, str(channel)) for event, channel in rows]


def settled_below(session: Session, *, created_before: float) -> int:
    """The highest id of the events created before `created_before` (0 when none): ids are handed out before
    commit, so only an event that old surely has no uncommitted neighbour with a lower id."""
    return int(session.exec(select(func.max(SessionEvent.id)).where(SessionEvent.created_at < created_before)).one()
               or 0)


def start_attempts(session: Session, *, event_ids: Sequence[int], surface: str) -> dict[int, int]:
    """Count one more delivery attempt of each event (creating its delivery row); returns event id -> attempts."""
    rows = {d.event_id: d for d in session.exec(select(EventDelivery).where(
        col(EventDelivery.event_id).in_(list(event_ids)), EventDelivery.surface == surface)).all()}
    for event_id in event_ids:
        row = rows.get(event_id) or EventDelivery(event_id=event_id, surface=surface)
        row.attempts += 1
        session.add(row)
        rows[event_id] = row
    session.flush()
    return {event_id: row.attempts for event_id, row in rows.items()}


def settle_events(session: Session, *, event_ids: Sequence[int], surface: str, status: str,
                  error: str | None = None) -> None:
    """Record how these events' delivery ended: `delivered` (with its time) or `failed` (with Slack's error)."""
    for row in session.exec(select(EventDelivery).where(col(EventDelivery.event_id).in_(list(event_ids)),
                                                        EventDelivery.surface == surface)).all():
        row.status, row.last_error = status, error
        row.delivered_at = now() if status == "delivered" else None
        session.add(row)


def get_posted(session: Session, *, scope: str) -> dict[str, tuple[str, str | None]]:
    """What was posted for a scope (a session id, `digest-<id>`): key -> (ts, hash of the content shown)."""
    rows = session.exec(select(SlackMessage).where(SlackMessage.scope == scope)).all()
    return {r.key: (r.ts, r.content_hash) for r in rows}


def record_message(session: Session, *, scope: str, key: str, channel: str, ts: str,
                   content_hash: str | None) -> SlackMessage:
    """Record a post (or its edit) under its key, right after Slack took it."""
    row = session.exec(select(SlackMessage).where(SlackMessage.scope == scope, SlackMessage.key == key)).first()
    if row is None:
        row = SlackMessage(scope=scope, key=key, channel=channel, ts=ts)
    row.ts, row.content_hash, row.updated_at = ts, content_hash, now()
    session.add(row)
    return row


def get_pending_digest_runs(session: Session) -> list[DigestRun]:
    """Digest runs recorded and not posted yet, oldest first."""
    return list(session.exec(select(DigestRun).where(DigestRun.status == "pending").order_by(col(DigestRun.id))).all())


def start_digest_attempt(session: Session, *, run_id: int | None) -> int | None:
    """Count one more attempt at posting a digest run; its attempts so far, or None when it is no longer pending."""
    run = session.get(DigestRun, run_id)
    if run is None or run.status != "pending":
        return None
    run.attempts += 1
    session.add(run)
    return run.attempts


def settle_digest_run(session: Session, *, run_id: int, status: str, error: str | None) -> None:
    """Record how posting a digest run ended: `posted` (with its time) or `failed` (with Slack's error)."""
    run = session.get(DigestRun, run_id)
    if run is not None:
        run.status, run.last_error = status, error
        run.posted_at = now() if status == "posted" else None
        session.add(run)
