"""Job kinds: what a runner can do, as named handlers. Each package keeps its kinds in a `JobKinds` of its own
(`EVALUATION_KINDS` here, `agents.session_jobs.AGENT_KINDS`); a process that runs jobs composes the ones it serves where
it starts (`compose`), and deployments add theirs with KERNELBOT_JOB_MODULES (modules whose `JOB_KINDS` is a
`JobKinds`). Nothing registers itself by being imported."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from storage.models import Evaluation
from storage.settings import Settings
from tpu_runner.candidate.spares import SparePool


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


EVALUATION_KINDS = JobKinds()  # this package's own: evaluate, production_check, noop
# Kinds only a runner on a TPU of the job's target may take: what they decide needs the chip itself.
ON_CHIP_KINDS = frozenset({"production_check"})


def production_check_wanted(result: Any) -> bool:
    """An `unverified` result not judged on a TPU: a check at the production shapes on the chip decides it (a
    kernel that failed only at derived shapes, one with no smaller configuration to check, one interpret mode
    cannot simulate, an estimate faster than physics)."""
    return result.verdict == "unverified" and result.host != "tpu"


def _artifacts_dir(result: Any) -> str | None:
    return str(Path(result.artifacts["result"]).parent) if result.artifacts else None


def evaluation_record(result: Any, runner_id: str | None = None, candidate_id: int | None = None) -> Evaluation:
    """An Evaluation row from an EvalResult."""
    perf = result.performance
    artifacts = _artifacts_dir(result)
    return Evaluation(task=result.task, target=result.target, verdict=result.verdict, stage=result.stage,
                      speedup=perf.speedup if perf else None, method=perf.method if perf else None,
                      result=result.to_json(), artifacts_dir=artifacts, runner_id=runner_id,
                      candidate_id=candidate_id)


def job_result(result: Any, **extra: Any) -> dict[str, Any]:
    """What a job's row keeps of an evaluation, for `kernelbot jobs` and `job` (the whole is its Evaluation)."""
    perf = result.performance
    return {"verdict": result.verdict, "message": result.message, "stage": result.stage,
            "error_kind": result.error.kind if result.error else None,
            "speedup": perf.speedup if perf else None, "method": perf.method if perf else None,
            "artifacts": _artifacts_dir(result), **extra}


def _carried(ctx: JobContext, payload: dict[str, Any]) -> tuple[Path, Path]:
    """The task and kernel a job names: the files it carries, unpacked on this runner (once per content), or - a job
    queued before jobs carried their files - the paths it was given."""
    if not (payload.get("task") and payload.get("kernel")) or ctx.engine is None:
        return Path(payload["task_dir"]), Path(payload["kernel_path"])
    from sqlmodel import Session

    from storage.blobs import unpack_files

    root = ctx.settings.home / "jobs"
    with Session(ctx.engine) as s:
        return unpack_files(s, payload["task"], root), unpack_files(s, payload["kernel"], root)


def _keep_files(ctx: JobContext, result: Any) -> dict[str, dict[str, str]]:
    """The evaluation's result, kernel, profile and traces stored with the job, for `kernelbot job ID --files`
    anywhere (the runner's own disk is not the team's)."""
    if ctx.engine is None or not result.artifacts:
        return {}
    from sqlmodel import Session

    from storage.blobs import keep_files

    with Session(ctx.engine) as s, s.begin():
        return keep_files(s, result.artifacts)


def _evaluate(ctx: JobContext, payload: dict[str, Any]) -> Any:
    from storage.blobs import BlobError
    from tpu_runner.evaluation.evaluate import EvalRequest, KernelFileError, evaluate
    from tpu_runner.hardware.targets import UnknownTarget
    from tpu_runner.tasks.task import TaskError

    try:
        task_dir, kernel_path = _carried(ctx, payload)
        request = EvalRequest(task_dir, kernel_path, payload.get("target") or ctx.settings.default_target,
                              bool(payload.get("allow_pure_jax", False)))
        return evaluate(request, ctx.settings, eval_id=f"job{ctx.job_id}-{int(time.time())}", spares=ctx.spares)
    except (KeyError, TaskError, KernelFileError, UnknownTarget, BlobError) as exc:
        raise JobRejected(f"{type(exc).__name__}: {exc}") from exc


@EVALUATION_KINDS.kind("evaluate")
def evaluate_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """payload: task_dir, kernel_path, target, allow_pure_jax. An `unverified` result judged off the chip is
    followed by a production check on a TPU runner of the target, when the fleet has one."""
    result = _evaluate(ctx, payload)
    files = _keep_files(ctx, result)
    then = []
    if production_check_wanted(result):
        then.append(FollowUp(kind="production_check", payload={**payload, "target": result.target,
                                                               "after_job": ctx.job_id},
                             target=result.target, dedup_key=f"production-check-{ctx.job_id}", needs_chip=True))
    return JobOutcome(result=job_result(result, files=files), evaluations=[evaluation_record(result, ctx.runner_id)],
                      then=then)


@EVALUATION_KINDS.kind("production_check")
def production_check_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """payload: an `evaluate` job's, plus after_job (the job whose unverified result this decides). Checked at the
    production shapes and timed on this runner's chip; its verdict is the kernel's."""
    target = payload.get("target") or ctx.settings.default_target
    if not ctx.settings.on_chip(target):
        raise JobRejected(f"a production check needs a TPU {target} on its runner's host, and this one has none")
    result = _evaluate(ctx, payload)
    after = payload.get("after_job")
    result.notes.append(f"production check on the chip of job {after}'s unverified result: this verdict decides it")
    return JobOutcome(result=job_result(result, decides_job=after, files=_keep_files(ctx, result)),
                      evaluations=[evaluation_record(result, ctx.runner_id)])


@EVALUATION_KINDS.kind("noop")
def noop_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Does nothing (for `seconds`): measures the queue itself."""
    time.sleep(float(payload.get("seconds", 0.0)))
    return JobOutcome(result={"slept": payload.get("seconds", 0.0)})
