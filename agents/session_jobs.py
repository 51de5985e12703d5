"""Agent job kinds for the runners: advance an Auto or a HITL session as far as it can go without people, and
one node of a search. `AGENT_KINDS`; a process that runs them composes them with the others where it starts
(`runner_kinds`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select

from agents.auto import AutoLoop
from agents.auto_decide import AutoConfig
from agents.brain import Brain, BrainError, Budget, Usage
from agents.brains import BrainUnavailable, make_brain
from agents.commands import ADVANCE_KIND, advance_job
from agents.hitl import HitlMachine
from agents.runtime import build_loop
from agents.search import NODE_JOB
from agents.search_node import NodeRunner
from agents.session_task import session_task
from storage import sessions
from storage.connect import open_database
from storage.models import KernelSession, SessionEvent
from tpu_runner.hardware import get_chip
from tpu_runner.jobs import JobContext, JobKinds, JobOutcome, JobRejected, compose, load_job_modules
from tpu_runner.reference import production_configurations
from tpu_runner.runner import EVALUATION_KINDS
from tpu_runner.tasks import Configuration, Task, TaskError

_engines: dict[str, Engine] = {}
AGENT_KINDS = JobKinds()


def runner_kinds(extra_modules: tuple[str, ...] = ()) -> JobKinds:
    """Everything a kernelbot runner serves: the evaluator's kinds, the agents', and a deployment's own."""
    return compose(EVALUATION_KINDS, AGENT_KINDS, load_job_modules(extra_modules))


def _engine(ctx: JobContext) -> Engine:
    url = ctx.settings.database
    if url not in _engines:
        _engines[url] = open_database(ctx.settings)
    return _engines[url]


def _advance(ctx: JobContext, payload: dict[str, Any], machine: type[AutoLoop]) -> JobOutcome:
    engine = _engine(ctx)
    session_id = str(payload["session_id"])
    with Session(engine) as s:
        record = sessions.get_session(s, session_id=session_id)
        target, budget = record.target, dict(record.budget or {})
    try:
        task = session_task(record, ctx.settings.home)
        # The session's spend so far travels in its steps, so a cap holds across jobs, runners and crashes.
        brain = _session_brain(ctx, record, task, spent=_spent_so_far(engine, session_id))
    except (TaskError, BrainUnavailable) as exc:
        raise JobRejected(str(exc)) from exc
    except BrainError as exc:
        raise JobRejected(f"the brain cannot answer: {exc.one_line()}") from exc
    configs = _production_configurations(task, ctx)  # once per job: for the thread and for the agents' prompts
    _describe_task(engine, session_id, configs)
    loop = build_loop(machine, engine=engine, brain=brain, task=task, chip=get_chip(target), settings=ctx.settings,
                      session_id=session_id, config=AutoConfig(max_iterations=int(budget.get("iterations", 5))),
                      spares=ctx.spares, configs=configs)
    outcome = loop.run(session_id)
    then = []
    if outcome.stop_reason.startswith("handed to"):  # a person changed hands while this job ran: go on in that mode
        with Session(engine) as s:
            record = sessions.get_session(s, session_id=session_id)
            then.append(advance_job(session_id=session_id, mode=record.mode, target=record.target))
    return JobOutcome(result={"session_id": session_id, "stop_reason": outcome.stop_reason,
                              "best_speedup": outcome.best_speedup, "evaluations": outcome.evaluations}, then=then)


def _session_brain(ctx: JobContext, record: KernelSession, task: Task, spent: float = 0.0) -> Brain:
    """The brain a session asked for, with the budget it was started with and what it has spent so far."""
    budget = dict(record.budget or {})
    return make_brain(budget.get("brain") or "anthropic", ctx.settings,
                      Budget(max_cost_usd=budget.get("max_cost_usd"), max_tokens=budget.get("max_tokens"),
                             spent=Usage(cost_usd=spent)),
                      task=task, chip=get_chip(record.target))


def _spent_so_far(engine: Engine, session_id: str) -> float:
    with Session(engine) as s:
        return max((float((st.outputs or {}).get("spent_usd") or 0.0)
                    for st in sessions.get_steps(s, session_id=session_id)), default=0.0)


def _production_configurations(task: Task, ctx: JobContext) -> list[Configuration]:
    try:
        return production_configurations(task, ctx.settings)
    except TaskError as exc:
        raise JobRejected(str(exc)) from exc


def _describe_task(engine: Engine, session_id: str, configs: list[Configuration]) -> None:
    """Once per session, the task's input shapes as an event (the Slack thread shows them; `serve` runs no JAX)."""
    with Session(engine) as s:
        if s.exec(select(SessionEvent.id).where(SessionEvent.session_id == session_id,
                                                SessionEvent.kind == "task_described")).first() is not None:
            return
    shapes = "; ".join(c.describe() for c in configs)
    with Session(engine) as s, s.begin():
        sessions.add_event(s, session_id=session_id, kind="task_described", payload={"shapes": shapes})


@AGENT_KINDS.kind(ADVANCE_KIND["auto"])
def auto_session_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    return _advance(ctx, payload, AutoLoop)


@AGENT_KINDS.kind(ADVANCE_KIND["hitl"])
def hitl_advance_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    return _advance(ctx, payload, HitlMachine)


@AGENT_KINDS.kind(NODE_JOB)
def search_node_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Generate (when a brain must), evaluate and record one candidate of a search, then top the search up."""
    def brain_for(record: KernelSession, task: Task) -> Brain:
        return _session_brain(ctx, record, task)

    runner = NodeRunner(engine=_engine(ctx), settings=ctx.settings, make_brain=brain_for, spares=ctx.spares,
                        runner_id=ctx.runner_id)
    try:
        return JobOutcome(result=runner.run(int(payload["candidate_id"]), job_id=ctx.job_id))
    except (KeyError, LookupError, TaskError) as exc:
        raise JobRejected(f"{type(exc).__name__}: {exc}") from exc
