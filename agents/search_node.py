"""One node of a search, as a runner runs it: generate the candidate when a brain must write it, evaluate it with
the IR gate (a program the session has evaluated is not evaluated again), record the evaluation, then top up the
graph (`agents.search.top_up`) so the next expansions are queued. A node job that finds its work done only tops up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from agents import strategies, subagents
from agents.brain import Brain, BrainError, BudgetExceeded
from agents.search import params_of, program_digest, stop_search, top_up
from agents.session_task import session_task
from agents.task_context import task_context
from storage import sessions
from storage.models import Candidate, Evaluation, KernelSession
from storage.settings import Settings
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest, KernelSource
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.hardware import UnknownTarget, get_chip
from tpu_runner.jobs import evaluation_record
from tpu_runner.reports import EvalError
from tpu_runner.tasks import Task, TaskError

BrainFactory = Callable[[KernelSession, Task], Brain]  # the session's brain, for its loaded task


@dataclass
class NodeRunner:
    """Runs one search_node job: generate (when a brain must), evaluate with the IR gate, record, top up."""

    engine: Engine
    settings: Settings
    make_brain: BrainFactory
    spares: SparePool | None = None
    runner_id: str | None = None

    def run(self, candidate_id: int, job_id: int | None = None) -> dict[str, Any]:
        with Session(self.engine) as s:
            candidate = s.get(Candidate, candidate_id)
            if candidate is None or candidate.session_id is None:
                raise LookupError(f"no search candidate {candidate_id}")
            record = sessions.get_session(s, session_id=candidate.session_id)
            done = s.exec(select(Evaluation).where(Evaluation.candidate_id == candidate_id)).first() is not None
            settled = done or candidate.duplicate_of is not None or bool((candidate.meta or {}).get("error"))
            session_id, status, code = record.id, record.status, candidate.code
            task, target = session_task(record, self.settings.home), record.target
        outcome: dict[str, Any] = {"candidate_id": candidate_id}
        if not settled and status == "active":
            try:
                if not code:
                    code = self._generate(candidate_id, task, target)
                if code:
                    outcome.update(self._evaluate(session_id, candidate_id, code, task, target, job_id))
            except (TaskError, UnknownTarget) as exc:
                # The candidate cannot be evaluated at all; the search goes on without it.
                self._mark_failed(candidate_id, f"{type(exc).__name__}: {exc}"[:500])
        with Session(self.engine) as s, s.begin():
            outcome["created"] = top_up(s, session_id, task=task)
        return outcome

    def _generate(self, candidate_id: int, task: Task, target: str) -> str:
        """The candidate's code from a brain; on failure the node is marked failed and "" returned."""
        with Session(self.engine) as s:
            candidate = s.get(Candidate, candidate_id)
            assert candidate is not None and candidate.session_id is not None
            record = sessions.get_session(s, session_id=candidate.session_id)
            parent = s.get(Candidate, candidate.parent_id) if candidate.parent_id else None
            parent_eval = s.exec(select(Evaluation).where(Evaluation.candidate_id == parent.id)).first() \
                if parent else None
            strategy = candidate.strategy or ""
        ctx = task_context(task, get_chip(target), self.settings)
        try:
            brain = self.make_brain(record, task)
            if parent is None:
                code = subagents.implement(brain, ctx, subagents.plan(brain, ctx))
            elif strategy == "self_debug":
                error = EvalError(**(parent_eval.result or {})["error"]) if parent_eval and parent_eval.result \
                    and (parent_eval.result or {}).get("error") else EvalError("unknown", "the evaluation failed")
                code = subagents.self_debug(brain, ctx, parent.code, error)
            else:
                chosen = strategies.get(strategy)
                summary = (parent_eval.result or {}).get("message", "") if parent_eval else "not evaluated"
                code = subagents.apply_strategy(brain, ctx, parent.code, title=chosen.title, advice=chosen.advice,
                                                evaluation=summary)
        except BudgetExceeded as exc:
            self._mark_failed(candidate_id, f"the brain's budget is spent: {exc}")
            with Session(self.engine) as s, s.begin():
                stop_search(s, record.id, f"budget: {exc}")
            return ""
        except BrainError as exc:  # no answers will come (key, quota, network): the search stops, saying why
            self._mark_failed(candidate_id, exc.one_line())
            with Session(self.engine) as s, s.begin():
                stop_search(s, record.id, f"brain: {exc.one_line()}")
            return ""
        except Exception as exc:  # noqa: BLE001 - a brain that cannot answer fails this node, not the search
            self._mark_failed(candidate_id, f"{type(exc).__name__}: {exc}"[:500])
            return ""
        with Session(self.engine) as s, s.begin():
            candidate = s.get(Candidate, candidate_id)
            assert candidate is not None
            candidate.code, candidate.content_hash = code, program_digest(code)
            candidate.meta = {**(candidate.meta or {}), "params": params_of(code)}
            s.add(candidate)
        return code

    def _mark_failed(self, candidate_id: int, error: str) -> None:
        with Session(self.engine) as s, s.begin():
            candidate = s.get(Candidate, candidate_id)
            assert candidate is not None
            candidate.meta = {**(candidate.meta or {}), "error": error}
            s.add(candidate)

    def _claim_ir(self, session_id: str, candidate_id: int, digest: str) -> str | None:
        """None when this candidate is the session's first with this program; else which candidate was."""
        for _ in range(2):
            try:
                with Session(self.engine) as s, s.begin():
                    other = s.exec(select(Candidate).where(Candidate.session_id == session_id,
                                                           Candidate.ir_hash == digest,
                                                           Candidate.id != candidate_id)).first()
                    candidate = s.get(Candidate, candidate_id)
                    assert candidate is not None
                    if other is not None:
                        candidate.duplicate_of = other.id
                        s.add(candidate)
                        return f"candidate {other.id}"
                    candidate.ir_hash = digest
                    s.add(candidate)
                return None
            except IntegrityError:
                continue  # another runner claimed this program a moment ago: look again
        raise RuntimeError(f"could not settle the IR digest {digest} of candidate {candidate_id}")

    def _evaluate(self, session_id: str, candidate_id: int, code: str, task: Task, target: str,
                  job_id: int | None) -> dict[str, Any]:
        result = evaluate(EvalRequest(task, KernelSource(code), target), self.settings, spares=self.spares,
                          eval_id=f"{session_id}-c{candidate_id}",
                          ir_gate=lambda digest: self._claim_ir(session_id, candidate_id, digest))
        if result.verdict != "duplicate":
            record = evaluation_record(result, self.runner_id, candidate_id)
            record.job_id = job_id
            with Session(self.engine) as s, s.begin():
                s.add(record)
        return {"verdict": result.verdict, "message": result.message}
