"""The job-kind contract: what a runner can do, as named handlers. Each package keeps its kinds in a `JobKinds` of
its own (`tpu_runner.runner.EVALUATION_KINDS`, `agents.session_jobs.AGENT_KINDS`); a process that runs jobs
composes the ones it serves where it starts (`compose`), and deployments add theirs with KERNELBOT_JOB_MODULES (modules
whose `JOB_KINDS` is a `JobKinds`). Nothing registers itself by being imported.

Handlers and the daemon both import this module, so neither reaches into the other: the daemon's package holds only
the daemon and the evaluator's own handlers."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from storage.models import Evaluation
from storage.settings import Settings
from tpu_runner.candidate import SparePool
from tpu_runner.reports import EvalResult


class JobRejected(Exception):
    """The job can never succeed as given (a broken task, a missing file): fail it now, without retries."""


@dataclass
class JobContext:
    settings: Settings
    runner_id: str
    job_id: int
    spares: SparePool | None = None
    engine: Engine | None = None  # the queue's database, where the files a job carries are


@dataclass(frozen=True)
class FollowUp:
    """A job to queue once this one is recorded done, in the same transaction (so it may share its dedup key)."""

    kind: str
    payload: dict[str, Any]
    target: str | None = None
    dedup_key: str | None = None
    session_id: str | None = None
    # Queued only when an active runner on a TPU of `target` serves `kind` (else the result says none could).
    needs_chip: bool = False


@dataclass
class JobOutcome:
    result: dict[str, Any] = field(default_factory=dict)
    evaluations: list[Evaluation] = field(default_factory=list)
    then: list[FollowUp] = field(default_factory=list)


JobHandler = Callable[[JobContext, dict[str, Any]], JobOutcome]


class JobKinds(dict[str, JobHandler]):
    """Named job handlers; `@kinds.kind("name")` adds one."""

    def kind(self, name: str) -> Callable[[JobHandler], JobHandler]:
        def add(handler: JobHandler) -> JobHandler:
            if name in self and self[name] is not handler:
                raise ValueError(f"job kind {name!r} is defined twice")
            self[name] = handler
            return handler

        return add


def compose(*parts: Mapping[str, JobHandler]) -> JobKinds:
    """The kinds a process serves; a name defined by two parts is an error."""
    out = JobKinds()
    for part in parts:
        for name, handler in part.items():
            if name in out and out[name] is not handler:
                raise ValueError(f"job kind {name!r} is defined twice")
            out[name] = handler
    return out


def load_job_modules(modules: Sequence[str]) -> JobKinds:
    """The kinds of the modules KERNELBOT_JOB_MODULES names (each defines `JOB_KINDS`, a JobKinds)."""
    found: list[Mapping[str, JobHandler]] = []
    for module in modules:
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"KERNELBOT_JOB_MODULES names {module!r}, which cannot be imported: {exc}") from exc
        kinds = getattr(loaded, "JOB_KINDS", None)
        if not isinstance(kinds, Mapping):
            raise ValueError(f"KERNELBOT_JOB_MODULES names {module!r}, which defines no JOB_KINDS (a JobKinds of "
                             "its job handlers)")
        found.append(kinds)
    return compose(*found)


def _artifacts_dir(result: EvalResult) -> str | None:
    return str(Path(result.artifacts["result"]).parent) if result.artifacts else None


def evaluation_record(result: EvalResult, runner_id: str | None = None, candidate_id: int | None = None) -> Evaluation:
    """An Evaluation row from an EvalResult."""
    perf = result.performance
    artifacts = _artifacts_dir(result)
    return Evaluation(task=result.task, target=result.target, verdict=result.verdict, stage=result.stage,
                      speedup=perf.speedup if perf else None, method=perf.method if perf else None,
                      result=result.to_json(), artifacts_dir=artifacts, runner_id=runner_id,
                      candidate_id=candidate_id)


def job_result(result: EvalResult, **extra: Any) -> dict[str, Any]:
    """What a job's row keeps of an evaluation, for `kernelbot jobs` and `job` (the whole is its Evaluation)."""
    perf = result.performance
    return {"verdict": result.verdict, "message": result.message, "stage": result.stage,
            "error_kind": result.error.kind if result.error else None,
            "speedup": perf.speedup if perf else None, "method": perf.method if perf else None,
            "artifacts": _artifacts_dir(result), **extra}
