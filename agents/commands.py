"""What surfaces (Slack, the terminal) do to sessions: record a command and enqueue the work it causes, in one
transaction. Surfaces never call agents directly; runners pick the work up (`agents.session_jobs`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from agents.auto_decide import AutoConfig, StepRecord
from agents.hitl import DecisionRejected, answered_step, hitl_next_action, record_decision_in
from agents.search import start_search, stop_search
from agents.search_decide import SearchConfig
from storage import queue, sessions
from storage.models import Decision, KernelSession
from tpu_runner.jobs import FollowUp
from tpu_runner.tasks import Task, load_task

ADVANCE_KIND = {"hitl": "hitl_advance", "auto": "auto_session"}
FINISHED = ("done", "cancelled", "failed")


def advance_job(*, session_id: str, mode: str, target: str) -> FollowUp:
    """The job that advances a session in its mode. One live advance job per session (its dedup key): a command
    while one is queued or running needs no second job - a job that finds its session handed to the other mode
    queues the next one itself as it ends."""
    # A session whose advance job fails for good cannot move: the runner marks it failed (`fails_session`).
    return FollowUp(kind=ADVANCE_KIND[mode], payload={"session_id": session_id, "fails_session": True}, target=target,
                    dedup_key=f"advance:{session_id}", session_id=session_id)


def _enqueue_advance(s: Session, *, session_id: str, mode: str, target: str) -> int | None:
    job = advance_job(session_id=session_id, mode=mode, target=target)
    return queue.enqueue(s, kind=job.kind, payload=job.payload, target=job.target, dedup_key=job.dedup_key,
                         session_id=job.session_id).id


def start_session(engine: Engine, *, mode: str, task: Task, target: str, owner: str | None = None,
                  budget: dict[str, Any] | None = None, slack_channel: str | None = None,
                  slack_thread_ts: str | None = None) -> str:
    """Record a HITL or Auto session and queue its first job. With `slack_thread_ts` the session lives in that
    existing thread (a session started from another one's thread) instead of a thread of its own."""
    if mode not in ADVANCE_KIND:
        raise ValueError(f"mode {mode!r} cannot be started here; choose one of {', '.join(ADVANCE_KIND)}")
    with Session(engine) as s, s.begin():
        record = sessions.create_session(s, mode=mode, task=task.task_id, task_dir=str(task.path), target=target,
                                         owner=owner, budget=budget or {}, slack_channel=slack_channel,
                                         slack_thread_ts=slack_thread_ts)
        sessions.add_event(s, session_id=record.id, kind="session_started",
                           payload={"mode": mode, "task": task.task_id, "target": target, "owner": owner})
        _enqueue_advance(s, session_id=record.id, mode=mode, target=target)
        return record.id


def decide(engine: Engine, *, session_id: str, actor: str, action: str, text: str | None = None,
           step: int | None = None, via: str | None = None) -> str:
    """Record a person's decision and queue what it sets going, in one transaction (a crash leaves both or
    neither); returns the session's mode afterwards."""
    if action == "cancel":
        cancel_session(engine, session_id=session_id, actor=actor, step=step, via=via)
        return "cancelled"
    with Session(engine) as s, s.begin():
        return _decide_in(s, session_id=session_id, actor=actor, action=action, text=text, step=step, via=via)


def _decide_in(s: Session, *, session_id: str, actor: str, action: str, text: str | None, step: int | None,
               via: str | None) -> str:
    mode = record_decision_in(s, session_id=session_id, actor=actor, action=action, text=text, step=step, via=via)
    if action in ("finish", "adopt", "search"):
        sessions.set_session_status(s, session_id=session_id, status="done")
    else:
        target = sessions.get_session(s, session_id=session_id).target
        _enqueue_advance(s, session_id=session_id, mode=mode, target=target)
    return mode


def cancel_session(engine: Engine, *, session_id: str, actor: str, step: int | None = None,
                   via: str | None = None) -> None:
    """Stop a session at any point: its queued jobs are cancelled, a running one stops at its next step (a
    search stops expanding). Recorded as a decision and an event, like every other decision."""
    with Session(engine) as s, s.begin():
        record = sessions.get_session(s, session_id=session_id)
        if record.status in FINISHED:
            raise DecisionRejected(f"session {session_id} is already {record.status}")
        answers = answered_step(s, session_id=session_id, step=step)
        if record.mode == "search":
            stop_search(s, session_id, f"cancelled by {actor}")
        queue.cancel_queued(s, session_id=session_id)
        sessions.set_session_status(s, session_id=session_id, status="cancelled")
        outputs = {"action": "cancel", "text": None, "actor": actor, "answers": answers, "via": via}
        if record.mode != "search":
            decision_step = sessions.add_step(s, session_id=session_id, kind="decision", outputs=outputs)
            s.add(Decision(session_id=session_id, step_id=decision_step.id, actor=actor, action="cancel"))
        sessions.add_event(s, session_id=session_id, kind="decision", payload=outputs)


def continue_with_search(engine: Engine, *, session_id: str, actor: str, step: int | None = None,
                         config: SearchConfig | None = None, via: str | None = None) -> str:
    """Start a search seeded with a finished Auto session's best kernel, in the same thread; returns its id."""
    with Session(engine) as s:
        record = sessions.get_session(s, session_id=session_id)
        if record.best_candidate_id is None:
            raise DecisionRejected(f"session {session_id} has no kernel faster than the reference to search from")
        seed = sessions.get_candidate(s, candidate_id=record.best_candidate_id)
        task, target, brain = load_task(record.task_dir or ""), record.target, (record.budget or {}).get("brain")
        channel, thread = record.slack_channel, record.slack_thread_ts
    with Session(engine) as s, s.begin():  # the decision and the search it starts: both or neither
        _decide_in(s, session_id=session_id, actor=actor, action="search", text=None, step=step, via=via)
        return start_search(s, task=task, target=target, config=config or SearchConfig(), seed_code=seed.code,
                            brain=brain, owner=actor, slack_channel=channel, slack_thread_ts=thread)


def recover_stranded(engine: Engine) -> list[str]:
    """Sessions that should be moving but have no live job (its runner died past its retries, a job was lost,
    or the database was restored): queue their advance job again. Returns their ids. Safe to run any time, from
    any number of processes: the advance job's dedup key keeps it to one."""
    recovered: list[str] = []
    with Session(engine) as s, s.begin():
        live = queue.session_ids_with_jobs(s, statuses=("queued", "running"))
        # Only sessions that runners move (they have had jobs): a terminal runs its own sessions in-process.
        queued_ever = queue.session_ids_with_jobs(s)
        for record in sessions.get_unfinished_sessions(s, modes=tuple(ADVANCE_KIND), finished=FINISHED):
            if record.id in live or record.id not in queued_ever or not _has_work(s, record):
                continue
            _enqueue_advance(s, session_id=record.id, mode=record.mode, target=record.target)
            sessions.add_event(s, session_id=record.id, kind="session_recovered",
                               payload={"mode": record.mode, "reason": "it had work to do and no live job"})
            recovered.append(record.id)
    return recovered


def _has_work(s: Session, record: KernelSession) -> bool:
    """Whether agents, not people, are next in this session."""
    steps = [StepRecord(st.kind, dict(st.outputs or {})) for st in sessions.get_steps(s, session_id=record.id)]
    if record.mode == "auto":
        return record.status != "awaiting"
    action = hitl_next_action(steps, AutoConfig().max_debug_attempts)
    return not action.startswith(("await_", "stop:"))
