"""Sessions, their steps, candidates and events. Functions take the caller's session and never commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlmodel import Session, col, func, select

from storage.models import Candidate, Evaluation, KernelSession, SessionEvent, Step, now


def create_session(session: Session, *, mode: str, task: str, target: str, owner: str | None = None,
                   budget: dict[str, Any] | None = None, task_dir: str | None = None,
                   slack_channel: str | None = None, slack_thread_ts: str | None = None) -> KernelSession:
    record = KernelSession(mode=mode, task=task, target=target, owner=owner, budget=budget, task_dir=task_dir,
                           slack_channel=slack_channel, slack_thread_ts=slack_thread_ts)
    session.add(record)
    session.flush()
    return record


def get_session(session: Session, *, session_id: str) -> KernelSession:
    record = session.get(KernelSession, session_id)
    if record is None:
        raise LookupError(f"no session {session_id}")
    return record


def get_sessions(session: Session, *, limit: int, statuses: Sequence[str] | None = None) -> list[KernelSession]:
    """The newest sessions first (only those in `statuses`, when given): what listings show."""
    query = select(KernelSession).order_by(col(KernelSession.created_at).desc()).limit(limit)
    if statuses is not None:
        query = query.where(col(KernelSession.status).in_(list(statuses)))
    return list(session.exec(query).all())


def get_awaiting_sessions(session: Session, *, mode: str | None = None, limit: int | None = None
                          ) -> list[KernelSession]:
    """Sessions waiting for a person, the longest waiting first."""
    query = select(KernelSession).where(KernelSession.status == "awaiting").order_by(col(KernelSession.updated_at))
    if mode is not None:
        query = query.where(KernelSession.mode == mode)
    if limit is not None:
        query = query.limit(limit)
    return list(session.exec(query).all())


def get_unfinished_sessions(session: Session, *, modes: Sequence[str], finished: Sequence[str]
                            ) -> list[KernelSession]:
    """Sessions of these modes whose status is not one of `finished`: those that may still have work."""
    return list(session.exec(select(KernelSession).where(col(KernelSession.mode).in_(list(modes)),
                                                         col(KernelSession.status).not_in(list(finished)))).all())


def get_session_in_thread(session: Session, *, channel: str, thread_ts: str, statuses: Sequence[str]
                          ) -> KernelSession | None:
    """The newest session in one of `statuses` that lives in this Slack thread (several may share one)."""
    return session.exec(select(KernelSession).where(KernelSession.slack_channel == channel,
                                                    KernelSession.slack_thread_ts == thread_ts,
                                                    col(KernelSession.status).in_(list(statuses)))
                        .order_by(col(KernelSession.created_at).desc())).first()


def set_thread(session: Session, *, session_id: str, thread_ts: str) -> None:
    """Keep where the session's thread starts; a thread already recorded stays, so a late retry moves nothing."""
    record = session.get(KernelSession, session_id)
    if record is not None and record.slack_thread_ts is None:
        record.slack_thread_ts = thread_ts
        session.add(record)


def get_steps(session: Session, *, session_id: str, status: str | None = "done") -> list[Step]:
    query = select(Step).where(Step.session_id == session_id).order_by(col(Step.index))
    if status:
        query = query.where(Step.status == status)
    return list(session.exec(query).all())


def last_step_index(session: Session, *, session_id: str, work_only: bool = True) -> int | None:
    """The index of the session's latest step (by default the latest the agents did, not a person's decision)."""
    query = select(func.max(Step.index)).where(Step.session_id == session_id)
    if work_only:
        query = query.where(Step.kind != "decision")
    return session.exec(query).one()


def decision_answering(session: Session, *, session_id: str, step_index: int) -> Step | None:
    """The latest decision a person took on this step, if any."""
    for step in reversed(get_steps(session, session_id=session_id)):
        if step.kind == "decision" and (step.outputs or {}).get("answers") == step_index:
            return step
    return None


def add_step(session: Session, *, session_id: str, kind: str, inputs: dict[str, Any] | None = None,
             outputs: dict[str, Any] | None = None, status: str = "done") -> Step:
    last = session.exec(select(func.max(Step.index)).where(Step.session_id == session_id)).one()
    step = Step(session_id=session_id, index=(last or 0) + 1, kind=kind, status=status, inputs=inputs or {},
                outputs=outputs or {})
    session.add(step)
    session.flush()
    return step


def get_candidate(session: Session, *, candidate_id: int | None) -> Candidate:
    """The candidate with this id (NoResultFound when there is none: callers hold ids they read)."""
    return session.exec(select(Candidate).where(Candidate.id == candidate_id)).one()


def get_evaluations(session: Session, *, candidate_ids: Sequence[int]) -> list[Evaluation]:
    """The evaluations of these candidates, oldest first: keyed by candidate, a re-evaluation wins."""
    if not candidate_ids:
        return []
    return list(session.exec(select(Evaluation).where(col(Evaluation.candidate_id).in_(list(candidate_ids)))
                             .order_by(col(Evaluation.id))).all())


def add_candidate(session: Session, *, task: str, code: str, content_hash: str, session_id: str | None = None,
                  parent_id: int | None = None, plan: str | None = None, strategy: str | None = None,
                  meta: dict[str, Any] | None = None) -> Candidate:
    candidate = Candidate(task=task, code=code, content_hash=content_hash, session_id=session_id,
                          parent_id=parent_id, plan=plan, strategy=strategy, meta=meta)
    session.add(candidate)
    session.flush()
    return candidate


def add_event(session: Session, *, session_id: str, kind: str, payload: dict[str, Any]) -> SessionEvent:
    event = SessionEvent(session_id=session_id, kind=kind, payload=payload)
    session.add(event)
    session.flush()
    return event


def get_latest_event(session: Session, *, session_id: str, kind: str) -> SessionEvent | None:
    """The session's newest event of this kind, if it had one."""
    return session.exec(select(SessionEvent).where(SessionEvent.session_id == session_id, SessionEvent.kind == kind)
                        .order_by(col(SessionEvent.id).desc())).first()


def set_session_status(session: Session, *, session_id: str, status: str, best_candidate_id: int | None = None) -> None:
    record = get_session(session, session_id=session_id)
    record.status, record.updated_at = status, now()
    if best_candidate_id is not None:
        record.best_candidate_id = best_candidate_id
    session.add(record)
