"""What surfaces (Slack, the terminal) do to sessions: record a command and enqueue the work it causes, in one
transaction. Surfaces never call agents directly; runners pick the work up (`agents.jobs`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from agents.hitl import record_decision
from storage import queue, sessions
from tpu_runner.tasks import Task

ADVANCE_KIND = {"hitl": "hitl_advance", "auto": "auto_session"}


def _enqueue_advance(s: Session, *, session_id: str, mode: str, target: str) -> int | None:
    # One live advance job per session: a second command while one is queued or running needs no second job.
    job = queue.enqueue(s, kind=ADVANCE_KIND[mode], payload={"session_id": session_id}, target=target,
                        dedup_key=f"advance:{session_id}", session_id=session_id)
    return job.id


def start_session(engine: Engine, *, mode: str, task: Task, target: str, owner: str | None = None,
                  budget: dict[str, Any] | None = None, slack_channel: str | None = None) -> str:
    if mode not in ADVANCE_KIND:
        raise ValueError(f"mode {mode!r} cannot be started here; choose one of {', '.join(ADVANCE_KIND)}")
    with Session(engine) as s, s.begin():
        record = sessions.create_session(s, mode=mode, task=task.task_id, task_dir=str(task.path), target=target,
                                         owner=owner, budget=budget or {}, slack_channel=slack_channel)
        sessions.add_event(s, session_id=record.id, kind="session_started",
                           payload={"mode": mode, "task": task.task_id, "target": target, "owner": owner})
        _enqueue_advance(s, session_id=record.id, mode=mode, target=target)
        return record.id


def decide(engine: Engine, *, session_id: str, actor: str, action: str, text: str | None = None) -> str:
    """Record a person's decision and queue what it sets going; returns the session's mode afterwards."""
    mode = record_decision(engine, session_id=session_id, actor=actor, action=action, text=text)
    if action in ("finish", "cancel"):
        with Session(engine) as s, s.begin():
            sessions.set_session_status(s, session_id=session_id, status="done" if action == "finish" else "cancelled")
        return mode
    with Session(engine) as s, s.begin():
        target = sessions.get_session(s, session_id=session_id).target
        _enqueue_advance(s, session_id=session_id, mode=mode, target=target)
    return mode
