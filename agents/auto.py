"""The Auto paradigm: plan -> implement -> evaluate (-> self-debug)* -> analyse -> re-plan, without people,
until the iteration budget, a plateau, a target speedup or the brain's budget stops it.

Each step is recorded before the next is decided (`auto_decide.next_action`), so a crash loses at most the
step that was running. The best candidate is only ever one the evaluator called `ok` and faster than the
reference; when none is, the outcome says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine
from sqlmodel import Session

from agents import subagents
from agents.auto_decide import AutoConfig, StepRecord, next_action, progress
from agents.brain import AnswerError, Brain, BrainError, BudgetExceeded
from storage import sessions
from tpu_runner.jobs import evaluation_record
from tpu_runner.reports import EvalError, EvalResult

StageCallback = Callable[[str], None]


class Evaluator(Protocol):
    """A candidate's code -> the evaluator's verdict; `on_stage` hears each stage as the evaluation enters it."""

    def __call__(self, code: str, on_stage: StageCallback | None = None) -> EvalResult: ...


@dataclass(frozen=True)
class AutoOutcome:
    session_id: str
    stop_reason: str  # iterations | plateau | target | budget: ...
    best_candidate_id: int | None
    best_speedup: float | None
    best_kernel_path: str | None
    best_result: dict[str, Any] | None
    evaluations: int

    @property
    def improved(self) -> bool:
        return self.best_candidate_id is not None


_EVENT_FIELDS = ("candidate_id", "verdict", "message", "speedup", "method", "band", "kernel_path", "reason")


def step_event(index: int, kind: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """A step's event payload: the step (whose outputs hold the full plan or code) and its headline fields."""
    return {"step": index, "kind": kind, **{k: outputs[k] for k in _EVENT_FIELDS if outputs.get(k) is not None}}


@dataclass
class AutoLoop:
    engine: Engine
    brain: Brain
    ctx: subagents.TaskContext
    evaluate: Evaluator
    workdir: Path  # where each evaluated candidate's file is written for people (`kernel_path`)
    config: AutoConfig = AutoConfig()
    on_step: Callable[[str, dict[str, Any]], None] | None = None
    mode: str = "auto"  # the session mode this loop serves; it stops when the session is handed to another

    def _state(self, session_id: str) -> tuple[str, str]:
        """(mode, status) of the session as recorded now: a person may have handed it over or cancelled it."""
        with Session(self.engine) as s:
            record = sessions.get_session(s, session_id=session_id)
            return record.mode, record.status

    def decide(self, steps: list[StepRecord]) -> str:
        return next_action(steps, self.config)

    def run(self, session_id: str) -> AutoOutcome:
        stop_reason = ""
        while not stop_reason:
            steps = self._steps(session_id)
            mode, status = self._state(session_id)
            if status == "cancelled":
                stop_reason = "cancelled"
                break
            if self.mode != mode:
                stop_reason = f"handed to {mode}"
                break
            action = self.decide(steps)
            if action.startswith(("stop:", "await_")):
                stop_reason = action.removeprefix("stop:")
                break
            try:
                outputs = self._do(action, steps, session_id)
            except BudgetExceeded as exc:
                stop_reason = f"budget: {exc}"
                break
            except BrainError as exc:  # no answer at all (key, quota, network): nothing more can be done now
                stop_reason = f"brain: {exc.one_line()}"
                break
            except AnswerError as exc:
                # An unusable answer ends this iteration (it used one, and was paid for); the next one starts from
                # a fresh plan, and enough of them in a row stop the session.
                action, outputs = "give_up", {"reason": str(exc), "unusable": action}
            budget = getattr(self.brain, "budget", None)
            if budget is not None and budget.spent.cost_usd:  # the session's spend so far, kept with its steps
                outputs = {**outputs, "spent_usd": round(budget.spent.cost_usd, 6)}
            with Session(self.engine) as s, s.begin():
                step = sessions.add_step(s, session_id=session_id, kind=action, outputs=outputs)
                # What people should see of the step, for every surface (the terminal, the Slack notifier).
                sessions.add_event(s, session_id=session_id, kind="step", payload=step_event(step.index, action,
                                                                                             outputs))
            if self.on_step:
                self.on_step(action, outputs)
        return self._finish(session_id, stop_reason)

    def _steps(self, session_id: str) -> list[StepRecord]:
        with Session(self.engine) as s:
            return [StepRecord(st.kind, dict(st.outputs or {})) for st in sessions.get_steps(s, session_id=session_id)]

    def _latest(self, steps: list[StepRecord], *kinds: str) -> dict[str, Any]:
        return next(st.outputs for st in reversed(steps) if st.kind in kinds)

    def _do(self, action: str, steps: list[StepRecord], session_id: str) -> dict[str, Any]:
        if action == "plan":
            previous = next((st.outputs.get("summary") for st in reversed(steps) if st.kind == "analyse"), None)
            last = steps[-1] if steps else None
            redirect = last.outputs.get("text") if last and last.kind == "decision" and \
                last.outputs.get("action") == "redirect" else None
            plans = [st.outputs.get("plan") for st in steps if st.kind == "plan"]
            made = subagents.plan(self.brain, self.ctx, previous=previous, redirect=redirect,
                                  last_plan=plans[-1] if plans else None, number=len(plans) + 1)
            return {"plan": made.render(), "redirect": redirect}
        if action == "implement":
            plan = subagents.parse_plan(self._latest(steps, "plan")["plan"])
            return self._store(session_id, subagents.implement(self.brain, self.ctx, plan), plan.render())
        if action == "debug":
            last_eval = self._latest(steps, "evaluate")
            code_step = self._latest(steps, "implement", "debug")
            history = [subagents.Attempt(code="", error=EvalError(**st.outputs["error"]))
                       for st in steps if st.kind == "evaluate" and st.outputs.get("error")][:-1]
            fixed = subagents.self_debug(self.brain, self.ctx, code_step["code"], EvalError(**last_eval["error"]),
                                         history=history[-3:])
            return self._store(session_id, fixed, None, parent_id=code_step["candidate_id"])
        if action == "evaluate":
            return self._evaluate(session_id, self._latest(steps, "implement", "debug"))
        if action == "analyse":
            last_eval = self._latest(steps, "evaluate")
            summary = last_eval.get("profile_summary") or last_eval.get("message", "")
            analysis = subagents.analyse_profile(self.brain, self.ctx, summary)
            return {"summary": f"{last_eval.get('message', '')}\n{summary}\nanalysis: {analysis}"}
        if action == "give_up":
            return {"reason": f"still failing after {self.config.max_debug_attempts} self-debug attempts"}
        raise ValueError(f"unknown action {action!r}")

    def _store(self, session_id: str, code: str, plan: str | None, parent_id: int | None = None) -> dict[str, Any]:
        digest = hashlib.sha256(code.encode()).hexdigest()[:16]
        with Session(self.engine) as s, s.begin():
            candidate = sessions.add_candidate(s, task=self.ctx.task_id, code=code, content_hash=digest,
                                               session_id=session_id, parent_id=parent_id, plan=plan)
            candidate_id = candidate.id
        return {"candidate_id": candidate_id, "code": code}

    def _evaluate(self, session_id: str, code_step: dict[str, Any]) -> dict[str, Any]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        candidate_id = code_step["candidate_id"]
        path = self.workdir / f"candidate_{candidate_id}.py"
        path.write_text(code_step["code"])

        def on_stage(stage: str) -> None:  # people watch the evaluation move: compiling, testing, profiling
            with Session(self.engine) as s, s.begin():
                sessions.add_event(s, session_id=session_id, kind="progress",
                                   payload={"candidate_id": candidate_id, "stage": stage})

        result = self.evaluate(code_step["code"], on_stage=on_stage)
        perf = result.performance
        with Session(self.engine) as s, s.begin():
            s.add(evaluation_record(result, candidate_id=code_step["candidate_id"]))
        return {"candidate_id": code_step["candidate_id"], "verdict": result.verdict, "message": result.message,
                "speedup": perf.speedup if perf else None, "method": perf.method if perf else None,
                "band": perf.band if perf else None,
                "error": result.error.to_json() if result.error else None, "kernel_path": str(path),
                "profile_summary": (result.profile or {}).get("summary")}

    def _finish(self, session_id: str, stop_reason: str) -> AutoOutcome:
        steps = self._steps(session_id)
        p = progress(steps)
        best = next((st.outputs for st in steps if st.kind == "evaluate"
                     and st.outputs.get("candidate_id") == p.best_candidate_id), None) if p.best_candidate_id else None
        evaluations = sum(st.kind == "evaluate" for st in steps)
        waiting = stop_reason.startswith("await_") or stop_reason.startswith("handed to")
        with Session(self.engine) as s, s.begin():
            status = "cancelled" if sessions.get_session(s, session_id=session_id).status == "cancelled" else \
                "awaiting" if waiting else "done"
            sessions.set_session_status(s, session_id=session_id, status=status, best_candidate_id=p.best_candidate_id)
            # `awaits_step`: the step a person answers next (the plan to approve, the result to decide on).
            sessions.add_event(s, session_id=session_id, kind=f"{self.mode}_{'paused' if waiting else 'finished'}",
                               payload={
                "stop_reason": stop_reason, "best_candidate_id": p.best_candidate_id, "best_speedup": p.best_speedup,
                "best_method": (best or {}).get("method"), "best_band": (best or {}).get("band"),
                "evaluations": evaluations, "awaits_step": sessions.last_step_index(s, session_id=session_id)})
        return AutoOutcome(session_id=session_id, stop_reason=stop_reason, best_candidate_id=p.best_candidate_id,
                           best_speedup=p.best_speedup, best_kernel_path=best.get("kernel_path") if best else None,
                           best_result=best, evaluations=evaluations)
