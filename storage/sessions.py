"""Sessions, their steps, candidates and events. Functions take the caller's session and never commit."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, func, select

from storage.models import Candidate, KernelSession, SessionEvent, Step, now


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


def set_session_status(session: Session, *, session_id: str, status: str, best_candidate_id: int | None = None) -> None:
    record = get_session(session, session_id=session_id)
    record.status, record.updated_at = status, now()
    if best_candidate_id is not None:
        record.best_candidate_id = best_candidate_id
    session.add(record)
