"""The job queue: a table with leases.

Claiming takes the best runnable jobs (queued and due, or running with an expired lease) with
`SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL; on SQLite every transaction begins IMMEDIATE, so claims
from several processes queue on the database lock. Each claim raises the job's fence; heartbeats, completion,
failure and release only take effect with the current fence, so a runner whose lease expired and whose job
was taken over cannot record a result twice - its late result is discarded.

Functions take the caller's session and never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from storage.errors import KernelbotError
from storage.models import Evaluation, Job, now

MAX_BACKOFF_SECONDS = 300.0


class JobNotFound(KernelbotError, LookupError):
    """No job with that id."""
    next_step = "`kernelbot jobs` lists the jobs"


@dataclass(frozen=True)
class Lease:
    """A claimed job: what the holder needs to run it and to prove it still holds it."""

    job_id: int
    fence: int
    kind: str
    payload: dict[str, Any]
    attempts: int
    expires_at: float
    session_id: str | None = None  # the session this work belongs to, if any: results become its events


def backoff_seconds(attempts: int, base: float) -> float:
    return min(MAX_BACKOFF_SECONDS, base * 2 ** max(0, attempts - 1))


def enqueue(session: Session, *, kind: str, payload: dict[str, Any] | None = None, priority: int = 0,
            dedup_key: str | None = None, target: str | None = None, max_attempts: int = 3,
            session_id: str | None = None) -> Job:
    """Add a job; with a de-duplication key, an equal live job (queued or running) is returned instead."""
    if dedup_key is not None:
        live = session.exec(select(Job).where(Job.dedup_key == dedup_key,
                                              col(Job.status).in_(("queued", "running")))).first()
        if live is not None:
            return live
    job = Job(kind=kind, payload=payload or {}, priority=priority, dedup_key=dedup_key, target=target,
              max_attempts=max_attempts, session_id=session_id)
    if dedup_key is None:
        session.add(job)
        session.flush()
        return job
    try:
        with session.begin_nested():  # another transaction may insert the same key between our check and insert
            session.add(job)
            session.flush()
    except IntegrityError:
        live = session.exec(select(Job).where(Job.dedup_key == dedup_key,
                                              col(Job.status).in_(("queued", "running")))).first()
        if live is None:
            raise
        return live
    return job


def claim(session: Session, *, runner_id: str, kinds: Sequence[str], targets: Sequence[str], lease_seconds: float,
          limit: int = 1) -> list[Lease]:
    """Lease up to `limit` runnable jobs of these kinds for this runner; highest priority, then oldest, first.

    A running job whose lease expired and that has used all its attempts is failed here with the reason.
    """
    t = now()
    runnable = or_(and_(Job.status == "queued", Job.run_after <= t),
                   and_(Job.status == "running", Job.lease_expires_at < t))
    query = (select(Job).where(col(Job.kind).in_(list(kinds)), runnable,
                               or_(col(Job.target).is_(None), col(Job.target).in_(list(targets))))
             .order_by(col(Job.priority).desc(), col(Job.id)))
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    leases: list[Lease] = []
    while len(leases) < limit:
        batch = session.exec(query.limit(limit - len(leases))).all()
        if not batch:
            break
        leases += _lease_batch(session, batch, runner_id=runner_id, lease_seconds=lease_seconds, t=t)
    session.flush()
    return leases


def _lease_batch(session: Session, batch: Sequence[Job], *, runner_id: str, lease_seconds: float,
                 t: float) -> list[Lease]:
    leases: list[Lease] = []
    for job in batch:
        if job.status == "running" and job.attempts >= job.max_attempts:
            job.status, job.finished_at, job.lease_expires_at = "failed", t, None
            job.last_error = (f"its runner {job.runner_id} stopped answering (lease expired) on each of "
                              f"{job.attempts} attempts; last error: {job.last_error or 'none recorded'}")
            session.add(job)
            session.flush()  # no longer runnable: the next batch will not see it again
            continue
        job.status, job.runner_id = "running", runner_id
        job.attempts += 1
        job.fence += 1
        job.lease_expires_at = t + lease_seconds
        job.started_at = t
        session.add(job)
        leases.append(Lease(job_id=job.id or 0, fence=job.fence, kind=job.kind, payload=dict(job.payload or {}),
                            attempts=job.attempts, expires_at=job.lease_expires_at, session_id=job.session_id))
    session.flush()
    return leases


def _held(job_id: int, fence: int) -> Any:
    return and_(Job.id == job_id, Job.fence == fence, Job.status == "running")


def heartbeat(session: Session, *, job_id: int, fence: int, lease_seconds: float) -> bool:
    """Extend a lease; False when the lease was lost (expired and taken over, cancelled, or released)."""
    result = session.execute(update(Job).where(_held(job_id, fence)).values(lease_expires_at=now() + lease_seconds))
    return result.rowcount == 1


def complete(session: Session, *, job_id: int, fence: int, result: dict[str, Any] | None = None,
             evaluations: Iterable[Evaluation] = ()) -> bool:
    """Record the result exactly once: only the current holder's completion counts; False means discarded."""
    t = now()
    done = session.execute(update(Job).where(_held(job_id, fence))
                           .values(status="done", result=result or {}, finished_at=t, lease_expires_at=None))
    if done.rowcount != 1:
        return False
    for evaluation in evaluations:
        evaluation.job_id = job_id
        session.add(evaluation)
    session.flush()
    return True


def fail(session: Session, *, job_id: int, fence: int, reason: str, retry: bool = True,
         backoff_base: float = 2.0) -> str | None:
    """Record a failure: back to the queue after a back-off while attempts remain, else failed for good.

    Returns the job's new status, or None when the caller no longer held the job (nothing recorded).
    """
    job = session.exec(select(Job).where(_held(job_id, fence))).first()
    if job is None:
        return None
    t = now()
    if retry and job.attempts < job.max_attempts:
        status, values = "queued", {"run_after": t + backoff_seconds(job.attempts, backoff_base)}
    else:
        status, values = "failed", {"finished_at": t}
        if retry:
            reason = f"failed on all {job.attempts} attempts; last: {reason}"
    session.execute(update(Job).where(_held(job_id, fence))
                    .values(status=status, last_error=reason, lease_expires_at=None, **values))
    return status


def release(session: Session, *, job_id: int, fence: int) -> bool:
    """Give a job back untouched (a runner shutting down): queued again, the attempt not counted."""
    result = session.execute(update(Job).where(_held(job_id, fence))
                             .values(status="queued", lease_expires_at=None, runner_id=None,
                                     attempts=Job.attempts - 1, run_after=now()))
    return result.rowcount == 1


def return_jobs_of(session: Session, *, runner_id: str, why: str) -> list[int]:
    """The running jobs of a runner that is gone, back in the queue at once (the attempt counts; a job with none
    left fails with `why`); returns their ids."""
    t = now()
    jobs = session.exec(select(Job).where(Job.runner_id == runner_id, Job.status == "running")).all()
    for job in jobs:
        job.last_error = why
        job.lease_expires_at = None
        if job.attempts >= job.max_attempts:
            job.status, job.finished_at = "failed", t
        else:
            job.status, job.run_after = "queued", t
        job.fence += 1  # whatever the gone runner still sends is not its to record
        session.add(job)
    session.flush()
    return [job.id for job in jobs if job.id is not None]


def cancel(session: Session, *, job_id: int) -> bool:
    """Cancel a job that has not finished; a running holder finds out at its next heartbeat."""
    if session.get(Job, job_id) is None:
        raise JobNotFound(f"no job {job_id}")
    # Conditional on the status in the same statement: a completion committed meanwhile is not overwritten.
    result = session.execute(update(Job).where(Job.id == job_id, col(Job.status).in_(("queued", "running")))
                             .values(status="cancelled", finished_at=now(), lease_expires_at=None))
    return result.rowcount == 1


def cancel_queued(session: Session, *, session_id: str) -> int:
    """Cancel the session's jobs no runner holds yet (a running one finds out from its session); returns how many."""
    result = session.execute(update(Job).where(Job.session_id == session_id, col(Job.status) == "queued")
                             .values(status="cancelled", finished_at=now()))
    return int(result.rowcount)


def session_ids_with_jobs(session: Session, *, statuses: Sequence[str] | None = None) -> set[str]:
    """The sessions that have jobs (only jobs in `statuses`, when given)."""
    query = select(Job.session_id).where(col(Job.session_id).is_not(None))
    if statuses is not None:
        query = query.where(col(Job.status).in_(list(statuses)))
    return {session_id for session_id in session.exec(query).all() if session_id is not None}


def live_counts(session: Session) -> dict[str, int]:
    """How many jobs are queued and how many running (a status with none is missing)."""
    rows = session.exec(select(Job.status, func.count()).where(col(Job.status).in_(("queued", "running")))
                        .group_by(col(Job.status))).all()
    return {status: int(count) for status, count in rows}


def runnable_later(session: Session, *, kinds: Sequence[str], targets: Sequence[str]) -> int:
    """Jobs of these kinds that are queued (possibly backing off) or held by someone: work may still come."""
    query = select(func.count()).select_from(Job).where(
        col(Job.kind).in_(list(kinds)), col(Job.status).in_(("queued", "running")),
        or_(col(Job.target).is_(None), col(Job.target).in_(list(targets))))
    return int(session.exec(query).one())


def get_jobs(session: Session, *, limit: int = 100, status: str | None = None) -> list[Job]:
    query = select(Job).order_by(col(Job.id).desc()).limit(limit)
    if status:
        query = query.where(Job.status == status)
    return list(session.exec(query).all())


def evaluation_ids(session: Session, *, job_ids: Sequence[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {j: [] for j in job_ids}
    rows = session.exec(select(Evaluation.job_id, Evaluation.id).where(col(Evaluation.job_id).in_(list(job_ids))))
    for job_id, evaluation_id in rows:
        if job_id is not None and evaluation_id is not None:
            out[job_id].append(evaluation_id)
    return out
