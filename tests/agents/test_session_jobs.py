"""Sessions advanced by runners: commands record and enqueue, the runner's agent jobs do the work, people's
decisions set the next job going (the design's one-way flow, end to end with the real SDK and evaluator)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from agents.commands import decide, start_session
from agents.hitl import DecisionRejected
from agents.session_jobs import runner_kinds
from agents.subagents import PLAN_SECTIONS
from storage import sessions
from storage.connect import open_database
from storage.models import Job, SessionEvent
from storage.settings import load_settings
from tests.conftest import TASKS
from tests.fakes.anthropic_api import API_KEY, fake_anthropic
from tpu_runner.runner import RunnerConfig, RunnerDaemon
from tpu_runner.tasks import load_task

PLAN = "\n".join(f"## {s.title()}\n{s}: details" for s in PLAN_SECTIONS)
CODE = f"```python\n{(TASKS / 'softmax/solutions/pallas.py').read_text()}```"


@pytest.mark.slow
def test_hitl_session_through_the_queue_then_handed_to_auto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "ANTHROPIC_API_KEY": API_KEY,
                              "KERNELBOT_MODEL": "claude-opus-5-5"})
    engine = open_database(settings)

    def run_runner() -> None:
        config = RunnerConfig(name="agents", targets=("v6e",), exit_when_idle=True, poll_seconds=0.05,
                              kinds=("hitl_advance", "auto_session"))
        assert RunnerDaemon(engine=engine, settings=settings, config=config, job_kinds=runner_kinds()).run() == 0

    with fake_anthropic([{"text": PLAN}, {"text": CODE}, {"text": "HBM-bound"}, {"text": PLAN}, {"text": CODE},
                         {"text": "still HBM-bound"}]) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        sid = start_session(engine, mode="hitl", task=load_task(TASKS / "softmax"), target="v6e", owner="ana",
                            budget={"iterations": 2})
        run_runner()
        with Session(engine) as s:
            assert [st.kind for st in sessions.get_steps(s, session_id=sid)] == ["plan"]
            assert sessions.get_session(s, session_id=sid).status == "awaiting"
        with pytest.raises(DecisionRejected):
            decide(engine, session_id=sid, actor="ana", action="iterate")  # a plan awaits approval, not a result
        decide(engine, session_id=sid, actor="ben", action="approve")
        run_runner()
        assert decide(engine, session_id=sid, actor="ana", action="handoff") == "auto"
        run_runner()
    with Session(engine) as s:
        kinds = [st.kind for st in sessions.get_steps(s, session_id=sid)]
        assert kinds == ["plan", "decision", "implement", "evaluate", "analyse", "decision", "plan", "implement",
                         "evaluate", "analyse"]
        jobs = s.exec(select(Job).where(Job.session_id == sid).order_by(col(Job.id))).all()
        assert [(j.kind, j.status) for j in jobs] == [("hitl_advance", "done"), ("hitl_advance", "done"),
                                                      ("auto_session", "done")]
        events = [e.kind for e in s.exec(select(SessionEvent).where(SessionEvent.session_id == sid)
                                         .order_by(col(SessionEvent.id))).all()]
        assert events[0] == "session_started" and events.count("job_done") == 3 and "auto_finished" in events
        assert sessions.get_session(s, session_id=sid).best_candidate_id is not None
    assert len(fake.requests) == 6


def test_a_session_whose_advance_job_fails_for_good_is_marked_failed(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path)})
    engine = open_database(settings)
    task_dir = tmp_path / "gone"
    shutil.copytree(TASKS / "softmax", task_dir)
    sid = start_session(engine, mode="hitl", task=load_task(task_dir), target="v6e", owner="ana",
                        budget={"brain": "offline"})
    shutil.rmtree(task_dir)  # the task went away before a runner took the job
    config = RunnerConfig(name="agents", targets=("v6e",), exit_when_idle=True, poll_seconds=0.05,
                          kinds=("hitl_advance",))
    assert RunnerDaemon(engine=engine, settings=settings, config=config, job_kinds=runner_kinds()).run() == 0
    with Session(engine) as s:
        assert sessions.get_session(s, session_id=sid).status == "failed"
        failed = s.exec(select(SessionEvent).where(SessionEvent.session_id == sid,
                                                   SessionEvent.kind == "job_failed")).one()
        assert "does not exist" in failed.payload["reason"]
