"""A decision, the session's change and the job it queues are one transaction: a process killed between the
steps leaves all or nothing; and a sweep gives sessions left with work and no live job their job back."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from sqlmodel import Session, col, select

from agents.commands import decide, recover_stranded, start_session
from storage import sessions
from storage.connect import open_database
from storage.models import Job, SessionEvent
from storage.settings import load_settings
from tests.conftest import TASKS
from tpu_runner.tasks import load_task

REPO = Path(__file__).resolve().parents[2]


def _awaiting_approval(tmp_path: Path) -> tuple[object, str]:
    """A HITL session whose plan awaits approval, as a runner leaves it (its first job done)."""
    engine = open_database(load_settings({"KERNELBOT_HOME": str(tmp_path)}))
    sid = start_session(engine, mode="hitl", task=load_task(TASKS / "softmax"), target="v6e", owner="ana")
    with Session(engine) as s, s.begin():
        for job in s.exec(select(Job).where(Job.session_id == sid)).all():
            job.status = "done"
            s.add(job)
        sessions.add_step(s, session_id=sid, kind="plan", outputs={"plan": "## Analysis\nx"})
        sessions.set_session_status(s, session_id=sid, status="awaiting")
    return engine, sid


def _jobs(engine: object, sid: str) -> list[tuple[str, str]]:
    with Session(engine) as s:  # type: ignore[arg-type]
        return [(j.kind, j.status) for j in s.exec(select(Job).where(Job.session_id == sid)
                                                   .order_by(col(Job.id))).all()]


def test_a_process_killed_between_recording_a_decision_and_queueing_its_job_leaves_neither(tmp_path: Path) -> None:
    engine, sid = _awaiting_approval(tmp_path)
    # The approval runs in a process that dies (SIGKILL-like, no cleanup) right after the decision is written and
    # before its job is queued.
    script = textwrap.dedent(f"""
        import os
        from storage.connect import open_database
        from storage.settings import load_settings
        import agents.commands as commands

        def die(*args, **kwargs):
            os._exit(9)

        commands._enqueue_advance = die
        engine = open_database(load_settings({{"KERNELBOT_HOME": {str(tmp_path)!r}}}))
        commands.decide(engine, session_id={sid!r}, actor="ben", action="approve")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    with Session(engine) as s:  # type: ignore[arg-type]
        assert [st.kind for st in sessions.get_steps(s, session_id=sid)] == ["plan"]  # no decision without its job
        assert sessions.get_session(s, session_id=sid).status == "awaiting"
    assert _jobs(engine, sid) == [("hitl_advance", "done")]
    # The person's click can simply be made again: it is not refused as "busy".
    decide(engine, session_id=sid, actor="ben", action="approve")  # type: ignore[arg-type]
    assert _jobs(engine, sid) == [("hitl_advance", "done"), ("hitl_advance", "queued")]


def test_a_session_left_approved_with_no_live_job_is_recovered_once(tmp_path: Path) -> None:
    engine, sid = _awaiting_approval(tmp_path)
    decide(engine, session_id=sid, actor="ben", action="approve")  # type: ignore[arg-type]
    with Session(engine) as s, s.begin():  # type: ignore[arg-type]
        job = s.exec(select(Job).where(Job.session_id == sid, Job.status == "queued")).one()
        job.status = "failed"  # lost: its runner gave up on it without failing the session
        s.add(job)
    assert recover_stranded(engine) == [sid]  # type: ignore[arg-type]
    assert recover_stranded(engine) == []  # type: ignore[arg-type]  # its job is live again: nothing twice
    assert _jobs(engine, sid)[-1] == ("hitl_advance", "queued")
    with Session(engine) as s:  # type: ignore[arg-type]
        kinds = [e.kind for e in s.exec(select(SessionEvent).where(SessionEvent.session_id == sid)).all()]
        assert kinds.count("session_recovered") == 1


def test_sessions_waiting_for_people_or_run_by_a_terminal_are_left_alone(tmp_path: Path) -> None:
    engine, waiting = _awaiting_approval(tmp_path)
    with Session(engine) as s, s.begin():  # type: ignore[arg-type]
        terminal = sessions.create_session(s, mode="auto", task="softmax", target="v6e").id  # never had a job
    assert recover_stranded(engine) == []  # type: ignore[arg-type]
    assert _jobs(engine, waiting) == [("hitl_advance", "done")] and _jobs(engine, terminal) == []
