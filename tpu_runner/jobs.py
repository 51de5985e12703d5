"""Job kinds, registered in one place. Later issues add agent kinds (auto_session, search_expand, ...) with
`@job_kind`; deployments can add their own with KERNELBOT_JOB_MODULES (modules imported at runner start)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.models import Evaluation
from storage.settings import Settings
from tpu_runner.spares import SparePool


class JobRejected(Exception):
    """The job can never succeed as given (a broken task, a missing file): fail it now, without retries."""


@dataclass
class JobContext:
    settings: Settings
    runner_id: str
    job_id: int
    spares: SparePool | None = None


@dataclass(frozen=True)
class FollowUp:
    """A job to queue once this one is recorded done, in the same transaction (so it may share its dedup key)."""

    kind: str
    payload: dict[str, Any]
    target: str | None = None
    dedup_key: str | None = None
    session_id: str | None = None


@dataclass
class JobOutcome:
    result: dict[str, Any] = field(default_factory=dict)
    evaluations: list[Evaluation] = field(default_factory=list)
    then: list[FollowUp] = field(default_factory=list)


JobHandler = Callable[[JobContext, dict[str, Any]], JobOutcome]
JOB_KINDS: dict[str, JobHandler] = {}


def job_kind(name: str) -> Callable[[JobHandler], JobHandler]:
    def register(handler: JobHandler) -> JobHandler:
        if name in JOB_KINDS and JOB_KINDS[name] is not handler:
            raise ValueError(f"job kind {name!r} is registered twice")
        JOB_KINDS[name] = handler
        return handler

    return register


def load_job_modules(modules: list[str]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"KERNELBOT_JOB_MODULES names {module!r}, which cannot be imported: {exc}") from exc


def evaluation_record(result: Any, runner_id: str | None = None, candidate_id: int | None = None) -> Evaluation:
    """An Evaluation row from an EvalResult."""
    perf = result.performance
    artifacts = str(Path(result.artifacts["result"]).parent) if result.artifacts else None
    return Evaluation(task=result.task, target=result.target, verdict=result.verdict, stage=result.stage,
                      speedup=perf.speedup if perf else None, method=perf.method if perf else None,
                      result=result.to_json(), artifacts_dir=artifacts, runner_id=runner_id,
                      candidate_id=candidate_id)


@job_kind("evaluate")
def evaluate_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """payload: task_dir, kernel_path, target, allow_pure_jax."""
    from tpu_runner.evaluate import EvalRequest, KernelFileError, evaluate
    from tpu_runner.hardware import UnknownTarget
    from tpu_runner.tasks import TaskError

    try:
        request = EvalRequest(Path(payload["task_dir"]), Path(payload["kernel_path"]),
                              payload.get("target") or ctx.settings.default_target,
                              bool(payload.get("allow_pure_jax", False)))
        result = evaluate(request, ctx.settings, eval_id=f"job{ctx.job_id}-{int(time.time())}", spares=ctx.spares)
    except (KeyError, TaskError, KernelFileError, UnknownTarget) as exc:
        raise JobRejected(f"{type(exc).__name__}: {exc}") from exc
    return JobOutcome(result={"verdict": result.verdict, "message": result.message},
                      evaluations=[evaluation_record(result, ctx.runner_id)])


@job_kind("noop")
def noop_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Does nothing (for `seconds`): measures the queue itself."""
    time.sleep(float(payload.get("seconds", 0.0)))
    return JobOutcome(result={"slept": payload.get("seconds", 0.0)})
