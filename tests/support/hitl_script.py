"""HITL sessions advanced by the real HITL machine and the offline brain, with the evaluation replayed from a
real evaluator result (tests of what people see need the events, not the compile): the steps and events are
exactly what a runner records."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import Engine

from agents.auto import StageCallback
from agents.auto_decide import AutoConfig
from agents.brain import Budget
from agents.brains import make_brain
from agents.commands import decide, start_session
from agents.hitl import HitlMachine
from agents.task_context import task_context
from storage.settings import Settings
from tests.conftest import TASKS
from tpu_runner.hardware import get_chip
from tpu_runner.reports import EvalResult
from tpu_runner.tasks import load_task

RESULT = Path(__file__).resolve().parent.parent / "bot" / "data" / "softmax_ok_result.json"
STAGES = ("static", "lower", "compile", "correctness", "performance", "profile")


def replayed(code: str, on_stage: StageCallback | None = None) -> EvalResult:
    """The recorded evaluation of the suite's softmax kernel, its stages announced as the evaluator does."""
    for stage in STAGES:
        if on_stage:
            on_stage(stage)
    return EvalResult.from_json(json.loads(RESULT.read_text()))


def machine(engine: Engine, settings: Settings, workdir: Path) -> HitlMachine:
    task, chip = load_task(TASKS / "softmax"), get_chip("v6e")
    return HitlMachine(engine=engine, brain=make_brain("offline", settings, Budget(), task=task, chip=chip),
                       ctx=task_context(task, chip, settings), evaluate=replayed, workdir=workdir,
                       config=AutoConfig(max_iterations=3))


def start(engine: Engine, *, channel: str, owner: str = "U1") -> str:
    return start_session(engine, mode="hitl", task=load_task(TASKS / "softmax"), target="v6e", owner=owner,
                         budget={"brain": "offline", "iterations": 3}, slack_channel=channel)


def through_first_result(engine: Engine, settings: Settings, workdir: Path, session_id: str) -> None:
    """Plan (awaits approval) -> approved -> implemented, evaluated, analysed (awaits a decision)."""
    hitl = machine(engine, settings, workdir)
    hitl.run(session_id)
    decide(engine, session_id=session_id, actor="U1", action="approve", via="button")
    hitl.run(session_id)


def finished_auto(engine: Engine, settings: Settings, workdir: Path, *, channel: str, owner: str = "U1") -> str:
    """An Auto session run to its end (one iteration: the suite's softmax kernel, x2.00 estimated)."""
    from agents.auto import AutoLoop

    session_id = start_session(engine, mode="auto", task=load_task(TASKS / "softmax"), target="v6e", owner=owner,
                               budget={"brain": "offline", "iterations": 1}, slack_channel=channel)
    task, chip = load_task(TASKS / "softmax"), get_chip("v6e")
    AutoLoop(engine=engine, brain=make_brain("offline", settings, Budget(), task=task, chip=chip),
             ctx=task_context(task, chip, settings), evaluate=replayed, workdir=workdir,
             config=AutoConfig(max_iterations=1)).run(session_id)
    return session_id
