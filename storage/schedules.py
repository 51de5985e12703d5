"""Schedules: recurring work (a search at a cron line) that every scheduler reads, and the claim that lets one
fire start it once however many schedulers run. Functions take the caller's session and never commit."""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from storage.models import Schedule


def get_schedules(session: Session, *, kind: str, enabled_only: bool = False) -> list[Schedule]:
    """The schedules of a kind, oldest first (only the enabled ones, when asked)."""
    query = select(Schedule).where(Schedule.kind == kind).order_by(col(Schedule.id))
    if enabled_only:
        query = query.where(col(Schedule.enabled))
    return list(session.exec(query).all())


def get_schedule(session: Session, *, schedule_id: int) -> Schedule | None:
    return session.get(Schedule, schedule_id)


def get_schedule_named(session: Session, *, name: str) -> Schedule | None:
    """The schedule with this unique name (kind, channel, task and cron make it), if any."""
    return session.exec(select(Schedule).where(Schedule.name == name)).first()


def create_schedule(session: Session, *, name: str, kind: str, cron: str, timezone: str, channel: str | None,
                    payload: dict[str, Any]) -> Schedule:
    """Add a schedule; its name is unique, so an equal one raises IntegrityError here, at the flush."""
    row = Schedule(name=name, kind=kind, cron=cron, timezone=timezone, channel=channel, payload=payload)
    session.add(row)
    session.flush()
    return row


def delete_schedule(session: Session, *, schedule_id: int) -> None:
    """Remove a schedule; one already gone is not an error (two people may remove it at once)."""
    row = session.get(Schedule, schedule_id)
    if row is not None:
        session.delete(row)


def claim_schedule(session: Session, *, schedule_id: int, fire_at: float) -> Schedule | None:
    """Compare-and-set: move the schedule's `last_run_at` to this fire unless someone already did. Holding the
    row until the caller commits, so a second caller of the same fire waits, then finds it taken (None)."""
    claimed = session.execute(update(Schedule).where(
        col(Schedule.id) == schedule_id, col(Schedule.enabled),
        or_(col(Schedule.last_run_at).is_(None), col(Schedule.last_run_at) < fire_at),
    ).values(last_run_at=fire_at))
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        return None
    return session.exec(select(Schedule).where(Schedule.id == schedule_id)).one()
