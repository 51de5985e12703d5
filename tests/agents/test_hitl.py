"""HITL sessions: gates for people, decisions as recorded steps, hand-off to Auto and back, and resuming."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import Session, select

from agents.auto import AutoLoop
from agents.auto_decide import AutoConfig, StepRecord
from agents.brain import BrainReply, BrainRequest, ScriptedBrain
from agents.hitl import DecisionRejected, HitlMachine, hitl_next_action, record_decision, waiting_for
from agents.subagents import PLAN_SECTIONS, TaskContext
from storage import sessions
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import Decision
from storage.settings import Settings
from tests.conftest import TASKS
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest, KernelSource
from tpu_runner.evaluation.evaluate import evaluate

PLAN = "\n".join(f"## {s.title()}\n{s}: details" for s in PLAN_SECTIONS)
GOOD = (TASKS / "softmax/solutions/pallas.py").read_text()
CODE = f"```python\n{GOOD}```"
CTX = TaskContext(task_id="softmax", reference_source=(TASKS / "softmax/reference.py").read_text(),
                  signature="computation(x: f32[8192,8192])", target="v6e", hardware="v6e")


def S(kind: str, **outputs: object) -> StepRecord:  # noqa: N802
    return StepRecord(kind, dict(outputs))


def test_gates_and_transitions() -> None:
    assert hitl_next_action([], 2) == "plan"
    assert hitl_next_action([S("plan")], 2) == "await_approval"
    assert hitl_next_action([S("plan"), S("decision", action="approve")], 2) == "implement"
    assert hitl_next_action([S("plan"), S("decision", action="redirect", text="x")], 2) == "plan"
    done = [S("plan"), S("decision", action="approve"), S("implement"), S("evaluate", verdict="ok"), S("analyse")]
    assert waiting_for(done) == "await_decision" and hitl_next_action(done, 2) == "await_decision"
    assert hitl_next_action([*done, S("decision", action="finish")], 2) == "stop:finish"
    assert hitl_next_action([*done, S("decision", action="handback")], 2) == "await_decision"
    failing = [S("plan"), S("decision", action="approve"), S("implement"), S("evaluate", verdict="compile_error")]
    assert hitl_next_action(failing, 1) == "debug"
    assert hitl_next_action([*failing, S("debug"), S("evaluate", verdict="incorrect")], 1) == "give_up"


def _setup(tmp_path: Path, settings: Settings, spares: SparePool, brain: ScriptedBrain,  # type: ignore[no-untyped-def]
           mode: str = "hitl"):
    engine = make_engine(f"sqlite:///{tmp_path / 'kernelbot.db'}")
    upgrade(engine)
    with Session(engine) as s, s.begin():
        session_id = sessions.create_session(s, mode=mode, task="softmax", target="v6e").id

    def loop(cls: type[AutoLoop], b: ScriptedBrain, **config: int) -> AutoLoop:
        return cls(engine=engine, brain=b, ctx=CTX, workdir=tmp_path / "k", config=AutoConfig(**config),
                   evaluate=lambda code, on_stage=None: evaluate(EvalRequest(TASKS / "softmax", KernelSource(code),
                                                                             "v6e"), settings, on_stage=on_stage,
                                                                 spares=spares))  # the worker's compile servers

    return engine, session_id, loop


def test_decisions_that_do_not_fit_are_refused(tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    brain = ScriptedBrain([PLAN])
    engine, sid, loop = _setup(tmp_path, settings, spares, brain)
    with pytest.raises(DecisionRejected, match="busy; decisions allowed now: none"):
        record_decision(engine, session_id=sid, actor="ana", action="approve")
    assert loop(HitlMachine, brain).run(sid).stop_reason == "await_approval"
    with pytest.raises(DecisionRejected, match="awaiting approval; decisions allowed now: approve, redirect"):
        record_decision(engine, session_id=sid, actor="ana", action="finish")
    with pytest.raises(DecisionRejected, match="needs text"):
        record_decision(engine, session_id=sid, actor="ana", action="redirect", text=" ")


@pytest.mark.slow
def test_a_session_with_redirect_approval_handoff_and_handback(tmp_path: Path, settings: Settings,
                                                               spares: SparePool) -> None:
    brain = ScriptedBrain([PLAN, PLAN, CODE, "HBM-bound", PLAN, CODE, "still HBM-bound"])
    engine, sid, loop = _setup(tmp_path, settings, spares, brain)
    hitl = loop(HitlMachine, brain)
    assert hitl.run(sid).stop_reason == "await_approval"
    with Session(engine) as s:
        assert sessions.get_session(s, session_id=sid).status == "awaiting"
    record_decision(engine, session_id=sid, actor="ana", action="redirect", text="use 256-row blocks")
    assert hitl.run(sid).stop_reason == "await_approval"
    assert "use 256-row blocks" in brain.asked[1].prompt  # the redirect reached the planner
    record_decision(engine, session_id=sid, actor="ben", action="approve")
    outcome = hitl.run(sid)
    assert outcome.stop_reason == "await_decision" and outcome.best_speedup and outcome.best_speedup > 1
    assert record_decision(engine, session_id=sid, actor="ana", action="handoff") == "auto"
    auto = loop(AutoLoop, brain, max_iterations=2)
    assert auto.run(sid).stop_reason == "iterations"  # Auto carried on: a second plan, implementation, evaluation
    assert record_decision(engine, session_id=sid, actor="ana", action="handback") == "hitl"
    assert hitl.run(sid).stop_reason == "await_decision"
    record_decision(engine, session_id=sid, actor="ana", action="finish")
    final = hitl.run(sid)
    assert final.stop_reason == "finish" and final.evaluations == 2
    with Session(engine) as s:
        kinds = [st.kind for st in sessions.get_steps(s, session_id=sid)]
        assert kinds == ["plan", "decision", "plan", "decision", "implement", "evaluate", "analyse", "decision",
                         "plan", "implement", "evaluate", "analyse", "decision", "decision"]
        who = [(d.actor, d.action) for d in s.exec(select(Decision).order_by(Decision.id)).all()]
        assert who == [("ana", "redirect"), ("ben", "approve"), ("ana", "handoff"), ("ana", "handback"),
                       ("ana", "finish")]
        assert sessions.get_session(s, session_id=sid).status == "done"
    assert brain.replies == []


class DiesWhileImplementing(ScriptedBrain):
    def ask(self, request: BrainRequest) -> BrainReply:
        if request.role == "implementer":
            raise KeyboardInterrupt("the runner died")
        return super().ask(request)


@pytest.mark.slow
def test_a_crash_after_approval_resumes_with_the_approved_plan(tmp_path: Path, settings: Settings,
                                                               spares: SparePool) -> None:
    first = DiesWhileImplementing([PLAN])
    engine, sid, loop = _setup(tmp_path, settings, spares, first)
    assert loop(HitlMachine, first).run(sid).stop_reason == "await_approval"
    record_decision(engine, session_id=sid, actor="ana", action="approve")
    with pytest.raises(KeyboardInterrupt):
        loop(HitlMachine, first).run(sid)
    second = ScriptedBrain([CODE, "fine"])
    assert loop(HitlMachine, second).run(sid).stop_reason == "await_decision"
    assert [r.role for r in second.asked] == ["implementer", "analyst"]  # the plan was not asked for again
